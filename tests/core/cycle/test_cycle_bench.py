import json

from tessera.bench.cycle import main


def test_cycle_benchmark_runs_small_and_prints_json_last(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--nodes", "40", "--projects", "10", "--running", "300", "--pending", "80", "--repeat", "2"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert {"nodes", "pending", "running", "cycle_seconds_median", "bound", "evicted"} <= set(result)
    assert result["nodes"] == 40 and result["running"] == 300 and result["pending"] == 80
    assert result["bound"] > 0 and result["same_plan_every_cycle"] is True
