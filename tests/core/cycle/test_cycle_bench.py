import json

from tessera.bench.cycle import main


def test_cycle_benchmark_runs_small_and_prints_json_last(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--nodes", "40", "--projects", "10", "--running", "300", "--pending", "80", "--repeat", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert {"nodes", "pending", "running", "cycle_seconds_median", "bound", "evicted"} <= set(result)
    assert result["nodes"] == 40 and result["running"] == 300 and result["pending"] == 80
    assert result["bound"] > 0 and result["same_plan_every_cycle"] is True
    assert result["rss_bytes"] > 10 << 20
    assert result["warm_cycles"] == 3 and result["warm_equals_cold"] is True
    assert result["warm_cycle_cpu_seconds_median"] > 0


def test_reclaim_benchmark_runs_small_and_prints_json_last(capsys) -> None:  # type: ignore[no-untyped-def]
    from tessera.bench.reclaim import main as reclaim_main

    assert reclaim_main(["--sizes", "80,100", "--projects", "10"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["benchmark"] == "reclaim" and {"80", "100"} <= set(result)
    for size in ("80", "100"):
        r = result[size]
        assert r["reclaim_bindings_measured"] > 0 and r["ideal"] > 0
        assert r["evicted"] >= r["ideal"]  # a lower bound on the fewest possible
    assert result["evicted_over_ideal"] == max(result["80"]["evicted_over_ideal"], result["100"]["evicted_over_ideal"])
