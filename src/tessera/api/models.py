"""Request bodies of the REST API, validated by the core's rules.

The GPU fields are turned into a ``GpuRequest`` by ``tessera.core.requests.parse_gpu_request`` inside
the model's validator, so the API refuses exactly what the CLI and the scheduler refuse, with the
API's own field names in the message.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from tessera.api.compute_fields import compute_doc as compute_doc  # the view, shared
from tessera.core import text as tx
from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_profile
from tessera.core.model import GpuRequest
from tessera.core.requests import parse_gpu_request

CORE_TO_API = {
    "gpu": "gpuDevicesRequest",
    "gpu_devices": "gpuDevicesRequest",
    "gpu_portion": "gpuPortionRequest",
    "gpu_portion_limit": "gpuPortionLimit",
    "gpu_memory": "gpuMemoryRequest",
    "gpu_memory_limit": "gpuMemoryLimit",
    "gpu_model": "gpuModel",
}



def _clean(value: str) -> str:
    problem = tx.text_problem(value)
    if problem is not None:
        raise PydanticCustomError("invalid_text", problem)
    return value


# String fields any process, file and response can carry: no NUL byte, no lone surrogate
# (tessera.core.text), and a length bound for each kind of field.
ShortText = Annotated[str, Field(max_length=tx.MAX_SHORT), AfterValidator(_clean)]
NameText = Annotated[str, Field(min_length=1, max_length=tx.MAX_NAME), AfterValidator(_clean)]
EnvNameText = Annotated[str, Field(min_length=1, max_length=tx.MAX_ENV_NAME,
                                   pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"), AfterValidator(_clean)]
ArgText = Annotated[str, Field(max_length=tx.MAX_ARG), AfterValidator(_clean)]
CommandText = Annotated[str, Field(max_length=tx.MAX_COMMAND), AfterValidator(_clean)]
PathText = Annotated[str, Field(max_length=tx.MAX_PATH), AfterValidator(_clean)]
ImageText = Annotated[str, Field(max_length=tx.MAX_IMAGE), AfterValidator(_clean)]
SecretText = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_clean)]
Number = float | int | ShortText


class Strict(BaseModel):
    """Every request body refuses fields it does not know (a typo is an error, not a no-op)."""

    model_config = ConfigDict(extra="forbid")


_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]++|'[^']*+'|"(?:[^"\\]++|\\[\s\S])*+"|\\[\s\S])++""")
_PIECE = re.compile(
    r"""([^ \t\r\n'"\\]++)|'([^']*+)'|"((?:[^"\\]++|\\[\s\S])*+)"|\\([\s\S])""")
_OPEN_ESCAPE = re.compile(r'\\|"(?:[^"\\]++|\\[\s\S])*+\\')
_IN_DOUBLE = re.compile(r'\\(["\\])')
_BLANKS = re.compile(r"[ \t\r\n]*+")


def shell_words(line: str) -> list[str]:
    """``line`` split as ``shlex.split`` (POSIX mode, no comments) splits it, in linear time:
    possessive regular expressions instead of shlex's character-at-a-time loop (128 KiB of
    quoted text took shlex seconds). Raises ValueError with shlex's words."""
    words: list[str] = []
    pos = _BLANKS.match(line).end()  # type: ignore[union-attr]
    while pos < len(line):
        m = _WORD.match(line, pos)
        end = m.end() if m else pos
        if end < len(line) and line[end] not in " \t\r\n":
            raise ValueError("No escaped character" if _OPEN_ESCAPE.fullmatch(line, end)
                             else "No closing quotation")
        assert m is not None
        parts = []
        for plain, single, double, escaped in _PIECE.findall(m.group()):
            parts.append(plain or single or escaped or "".join(_IN_DOUBLE.split(double)))
        words.append("".join(parts))
        pos = _BLANKS.match(line, end).end()  # type: ignore[union-attr]
    return words


def split_command(command: str, args: str) -> list[str]:
    """``command`` and ``args`` split as a POSIX shell would (no expansion), in linear time
    (:func:`shell_words`)."""
    argv: list[str] = []
    for field, line in (("spec.command", command), ("spec.args", args)):
        try:
            argv += shell_words(line)
        except ValueError as exc:
            raise InvalidRequest(field, f"must be shell-quoted correctly: {exc}") from None
    tx.check_argv(argv)
    return argv


def invalid(field: str, rule: str, value: object = None) -> PydanticCustomError:
    shown = "" if value is None else f" (got {value!r})"
    return PydanticCustomError(
        "invalid_request", "{field}: {rule}{shown}", {"field": field, "rule": rule, "shown": shown}
    )


class Compute(Strict):
    gpuDevicesRequest: int | None = Field(default=None, ge=0, le=1024,
                                          description="Whole GPUs, or devices to share")
    gpuRequestType: Literal["portion", "memory"] | None = None
    gpuPortionRequest: Number | None = Field(default=None, description="Share of one GPU, (0, 1)")
    gpuPortionLimit: Number | None = Field(default=None, description="Burst cap, (0, 1]")
    gpuMemoryRequest: ShortText | int | None = Field(default=None, description="e.g. 5G, 4Gi, 2500M")
    gpuMemoryLimit: ShortText | int | None = None
    gpuModel: ShortText | None = Field(default=None,
                                      description="Allowed models, e.g. V100-16GB|A100-40GB")
    gpuMigProfile: ShortText | None = Field(
        default=None, description="A MIG partition instead of a GPU share, e.g. 3g.20gb "
        "(also mig-3g.20gb, nvidia.com/mig-3g.20gb); on GPUs an operator put in MIG mode")
    gpuComputeRequest: Number | None = Field(
        default=None, description="Guaranteed share of the GPU's time, [0, 1] (docs/compute-share.md)")
    gpuComputeLimit: Number | None = Field(default=None, description="Ceiling on that share, [request, 1]")
    gpuComputeMode: ShortText | None = Field(default=None, description="off, fair or strict")
    cpuCoreRequest: float | None = Field(default=None, ge=0, le=100_000)
    cpuMemoryRequest: ShortText | None = None

    _gpu: GpuRequest = PrivateAttr(default_factory=GpuRequest.none)

    @model_validator(mode="after")
    def _parse(self) -> Compute:
        if self.gpuMigProfile is not None:
            others = [f for f in ("gpuDevicesRequest", "gpuRequestType", "gpuPortionRequest",
                                  "gpuPortionLimit", "gpuMemoryRequest", "gpuMemoryLimit",
                                  "gpuModel") if getattr(self, f) is not None]
            if others:
                raise invalid(others[0], "must be empty with gpuMigProfile (a MIG partition is "
                              "the whole GPU request)")
            try:
                self.gpuMigProfile = parse_profile(self.gpuMigProfile, "gpuMigProfile")
            except InvalidRequest as exc:
                raise invalid(exc.field, exc.rule, exc.value) from None
            return self
        kind = self.gpuRequestType
        if kind == "portion" and self.gpuPortionRequest is None:
            raise invalid("gpuPortionRequest", "is required when gpuRequestType is portion")
        if kind == "memory" and self.gpuMemoryRequest is None:
            raise invalid("gpuMemoryRequest", "is required when gpuRequestType is memory")
        if kind == "portion" and self.gpuMemoryRequest is not None:
            raise invalid("gpuMemoryRequest", "must be empty when gpuRequestType is portion")
        if kind == "memory" and self.gpuPortionRequest is not None:
            raise invalid("gpuPortionRequest", "must be empty when gpuRequestType is memory")
        try:
            self._gpu = parse_gpu_request(
                gpu_devices=self.gpuDevicesRequest,
                gpu_portion=self.gpuPortionRequest,
                gpu_portion_limit=self.gpuPortionLimit,
                gpu_memory=self.gpuMemoryRequest,
                gpu_memory_limit=self.gpuMemoryLimit,
                gpu_model=self.gpuModel,
                memory_unit_required=True,
            )
        except InvalidRequest as exc:
            raise invalid(CORE_TO_API.get(exc.field, exc.field), exc.rule, exc.value) from None
        return self

    @property
    def gpu(self) -> GpuRequest:
        return self._gpu


class EnvVar(Strict):
    name: EnvNameText
    value: ArgText = ""


class PortSpec(Strict):
    container: int = Field(ge=1, le=65535, description="Port the workload listens on")
    external: int | None = Field(default=None, ge=1, le=65535,
                                 description="Port on the host (default: the same)")
    externalUrl: bool = Field(
        default=False, description="Reach it from outside (Run:ai's --external-url): embedded "
        "mode listens on the server's TESSERA_EXTERNAL_HOST; Kubernetes makes an Ingress "
        "(docs/workloads.md)")


class Autoscaling(Strict):
    """An inference that scales on a metric (Run:ai's ``autoscaling``; docs/workloads.md)."""

    minReplicas: int = Field(default=1, ge=1, le=16)
    maxReplicas: int = Field(default=1, ge=1, le=16)
    metric: ShortText = Field(default="concurrency",
                              description="concurrency or throughput (what tessera measures)")
    metricThreshold: float = Field(gt=0, le=1_000_000,
                                   description="Per replica: scale up above it")
    scaleDownDelaySeconds: float = Field(
        default=30, ge=0, le=3600, description="The cool-down: seconds from when the need fell "
        "(idle: the last connection closed) to the scale-down decision")

    @model_validator(mode="after")
    def _check(self) -> Autoscaling:
        if self.minReplicas > self.maxReplicas:
            raise invalid("minReplicas", f"must be at most maxReplicas ({self.maxReplicas})",
                          self.minReplicas)
        if self.metric not in ("concurrency", "throughput"):
            raise invalid("metric", "must be concurrency or throughput (what tessera measures "
                          "at the service's URL)", self.metric)
        return self


class WorkloadSpec(Strict):
    image: ImageText = Field(
        default="", description="Container image; with no command its entrypoint runs "
        "(embedded mode: through podman or docker)")
    command: CommandText = Field(
        default="", description="Program to run (shell-quoted)")
    args: CommandText = Field(
        default="", description="Its arguments (shell-quoted)")
    environmentVariables: list[EnvVar] = Field(default_factory=list, max_length=tx.MAX_ENV)
    workingDir: PathText | None = None
    compute: Compute = Field(default_factory=Compute)
    priorityClass: (
        Literal["train", "build-preemptible", "build", "interactive", "inference"] | None
    ) = None
    onEviction: Literal["requeue", "fail"] = Field(
        default="requeue", description="When reclaim or preemption evicts it: queue again or fail"
    )
    workers: int = Field(default=1, ge=1, le=64, description="Pods, each with the compute request")
    minWorkers: int | None = Field(default=None, ge=1, le=64, description="Gang minimum")
    ports: list[PortSpec] = Field(default_factory=list, max_length=16,
                                  description="Ports to expose; the URLs show in list/describe")
    parallelism: int | None = Field(default=None, ge=1, le=64,
                                    description="A sweep: trials that run at once")
    completions: int | None = Field(
        default=None, ge=1, le=10_000, description="A sweep: trials to complete; each sees "
        "JOB_COMPLETION_INDEX 0..completions-1 (as in a Kubernetes Indexed Job)")
    backoffLimit: int | None = Field(default=None, ge=0, le=1000,
                                     description="A sweep: failed trials retried in all (default 6)")
    autoscaling: Autoscaling | None = Field(default=None, description="An inference that scales")

    @model_validator(mode="after")
    def _gang(self) -> WorkloadSpec:
        if self.minWorkers is not None and self.minWorkers > self.workers:
            raise invalid("minWorkers", f"must be at most workers ({self.workers})", self.minWorkers)
        if self.autoscaling is not None:
            if len(self.ports) != 1:
                raise invalid("ports", "an inference that scales serves exactly one port "
                              "(its stable URL)", len(self.ports))
            if self.workers != 1 or self.completions is not None:
                raise invalid("autoscaling", "replicas are one pod each: give neither workers "
                              "nor completions")
        if self.completions is None:
            if self.parallelism is not None:
                raise invalid("completions", "is required with parallelism (the number of "
                              "trials; each sees JOB_COMPLETION_INDEX 0..completions-1)")
            if self.backoffLimit is not None:
                raise invalid("backoffLimit", "applies to a sweep: give completions too")
            return self
        if self.parallelism is not None and self.parallelism > self.completions:
            raise invalid("parallelism", f"must be at most completions ({self.completions}): a "
                          "sweep never runs more trials at once than it has", self.parallelism)
        if self.workers != 1:
            raise invalid("workers", "must be 1 in a sweep (each trial is one pod; parallelism "
                          "says how many run at once)", self.workers)
        return self

    @property
    def argv(self) -> list[str]:
        """The command line split into arguments; done by the route (a worker thread), not
        while the body is parsed on the event loop."""
        return split_command(self.command, self.args)


class WorkloadCreate(Strict):
    name: NameText
    projectId: ShortText | None = Field(default=None, description="Project id (or name)")
    projectName: ShortText | None = None
    clusterId: ShortText | None = None
    useGivenNameAsPrefix: bool = False
    spec: WorkloadSpec

    @model_validator(mode="after")
    def _project(self) -> WorkloadCreate:
        if not (self.projectId or self.projectName):
            raise invalid("projectId", "is required (or projectName)")
        return self

    def spec_doc(self) -> dict[str, Any]:
        return self.spec.model_dump(exclude={"compute"}, exclude_none=True)


class ExecRequest(Strict):
    command: list[ArgText] = Field(
        min_length=1, max_length=1000, description="argv, not a shell line")
    pod: int = Field(default=0, ge=0, le=63)
    timeoutSeconds: float = Field(default=60, gt=0, le=3600)


class TokenRequest(Strict):
    grantType: ShortText = "client_credentials"
    clientId: SecretText
    clientSecret: SecretText


class GpuQuota(Strict):
    deserved: float = Field(default=0, ge=0, le=10_000)
    limit: float | None = Field(default=None, ge=0, le=10_000)
    overQuotaWeight: float = Field(default=1, ge=0, le=1000)


class ProjectResources(Strict):
    gpu: GpuQuota = Field(default_factory=GpuQuota)


class ProjectCreate(Strict):
    name: NameText
    parentId: NameText | None = Field(default=None, description="Its department (name)")
    resources: ProjectResources = Field(default_factory=ProjectResources)
    priority: int = Field(default=50, ge=0, le=1000)


class ProjectUpdate(Strict):
    resources: ProjectResources = Field(default_factory=ProjectResources)
    priority: int = Field(default=50, ge=0, le=1000)


class GpuQuotaPatch(Strict):
    deserved: float | None = Field(default=None, ge=0, le=10_000)
    limit: float | None = Field(default=None, ge=0, le=10_000, description="null: no limit")
    overQuotaWeight: float | None = Field(default=None, ge=0, le=1000)


class ProjectResourcesPatch(Strict):
    gpu: GpuQuotaPatch = Field(default_factory=GpuQuotaPatch)


class ProjectPatch(Strict):
    """A partial update: only the fields given change (``limit: null`` removes the limit)."""

    resources: ProjectResourcesPatch = Field(default_factory=ProjectResourcesPatch)
    priority: int | None = Field(default=None, ge=0, le=1000)

    def merged(self, current: dict[str, Any]) -> tuple[float, float | None, float, int]:
        """(deserved, limit, overQuotaWeight, priority): ``current`` (a project document) with
        the fields this patch gives."""
        gpu = current["resources"]["gpu"]
        given = self.resources.gpu
        have = given.model_fields_set
        deserved = given.deserved if "deserved" in have and given.deserved is not None else gpu["deserved"]
        limit = given.limit if "limit" in have else gpu["limit"]
        weight = (given.overQuotaWeight if "overQuotaWeight" in have
                  and given.overQuotaWeight is not None else gpu["overQuotaWeight"])
        priority = self.priority if self.priority is not None else current["priority"]
        return float(deserved), None if limit is None else float(limit), float(weight), int(priority)
