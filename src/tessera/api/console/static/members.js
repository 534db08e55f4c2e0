// A workload's type and its members (docs/workloads.md, "Console"): what kind of workload it is
// (a distributed training's framework and gang, a sweep's trials, an inference's replicas and
// metric) and each member's role (rank, trial, replica, worker), for the workload page.
"use strict";

function workloadEnv(w) {
  const out = {};
  for (const e of (w.spec && w.spec.environmentVariables) || []) out[e.name] = e.value;
  return out;
}

function workloadTypeText(w) {
  const spec = w.spec || {};
  const parts = [w.type + (w.preemptible ? " (preemptible)" : "")];
  const framework = workloadEnv(w).TESSERA_FRAMEWORK;
  if (spec.completions) {
    parts.push(`sweep: ${spec.completions} trials, ${spec.parallelism || spec.completions} at once, backoff limit ${spec.backoffLimit ?? 6}`);
  } else if (spec.autoscaling) {
    const a = spec.autoscaling;
    parts.push(`${a.minReplicas}–${a.maxReplicas} replicas, scaling on ${a.metric} above ${a.metricThreshold} per replica`);
  } else if ((w.workers || 1) > 1) {
    const gang = w.minWorkers && w.minWorkers < w.workers ? `gang of ${w.minWorkers} of ${w.workers}` : `gang of ${w.workers}, started together`;
    parts.push(framework ? `distributed ${framework}: ${gang}` : gang);
  } else if (framework) {
    parts.push(framework);
  }
  return parts.join(" — ");
}

function memberRole(w, p) {
  const env = p.env || {};
  const spec = w.spec || {};
  const distributed = (w.workers || 1) > 1 || workloadEnv(w).TESSERA_FRAMEWORK;
  if (env.RANK !== undefined && distributed) return `rank ${env.RANK}${env.RANK === "0" ? " (master)" : ""}`;
  if (env.JOB_COMPLETION_INDEX !== undefined) return `trial ${env.JOB_COMPLETION_INDEX}`;
  if (spec.completions) return `trial ${p.index}`;
  if (spec.autoscaling) return `replica ${p.index}`;
  if ((w.workers || 1) > 1 || (w.pods || []).length > 1) return `worker ${p.index}`;
  return "—";
}

function memberRows(w) {
  return (w.pods || []).map((p) => [p.index, p.name || `${w.name}-${p.index}`, memberRole(w, p),
    p.phase || "—", p.nodeName || "—", p.gpuPlacement || "—", p.exitCode ?? "—"]);
}
