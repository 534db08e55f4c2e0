{{/* The control-plane image: repository@digest when a digest is given, else repository:tag. */}}
{{- define "tessera.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The node-side image (tessera-node with libtessera-cuda.so). */}}
{{- define "tessera.nodeImage" -}}
{{- if .Values.image.nodeDigest -}}
{{ .Values.image.nodeRepository }}@{{ .Values.image.nodeDigest }}
{{- else -}}
{{ .Values.image.nodeRepository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "tessera.pullSecrets" -}}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level security for the control plane: the image's non-root user, RuntimeDefault seccomp. */}}
{{- define "tessera.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "tessera.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "tessera.webhookService" -}}tessera-webhook{{- end -}}
{{- define "tessera.schedulerUser" -}}system:serviceaccount:{{ .Release.Namespace }}:tessera-scheduler{{- end -}}

{{/*
CEL: does this pod ask tessera for anything? Any tessera.io annotation, a Run:ai/KAI share
annotation, the cGPU label or resource, tessera's scheduler name, or GPU env set by hand.
Pods that match none of these never reach the webhooks, so they are never blocked by them.
Argument: the CEL variable (object or oldObject).
*/}}
{{- define "tessera.gpuPodCEL" -}}
{{- $o := . -}}
{{- $c := "(has(c.resources) && ((has(c.resources.limits) && 'aliyun.com/gpu-mem' in c.resources.limits) || (has(c.resources.requests) && 'aliyun.com/gpu-mem' in c.resources.requests))) || (has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES' || e.name == 'RUNAI_GPU_MEMORY_LIMIT' || e.name.startsWith('TESSERA_GPU_') || e.name.startsWith('ALIYUN_COM_GPU_MEM_')))" -}}
({{ $o }} != null && (
  (has({{ $o }}.metadata.annotations) && {{ $o }}.metadata.annotations.exists(k, k.startsWith('tessera.io/') || k in ['gpu-fraction', 'gpu-memory', 'gpu-fraction-num-devices', 'gpu-fraction-container-name', 'gpu-fraction-limit', 'gpu-memory-limit']))
  || (has({{ $o }}.metadata.labels) && 'aliyun.com/gpu-count' in {{ $o }}.metadata.labels)
  || (has({{ $o }}.spec.schedulerName) && {{ $o }}.spec.schedulerName == 'tessera')
  || {{ $o }}.spec.containers.exists(c, {{ $c }})
  || (has({{ $o }}.spec.initContainers) && {{ $o }}.spec.initContainers.exists(c, {{ $c }}))))
{{- end -}}

{{- define "tessera.clientConfig" -}}
{{- $root := index . 0 -}}{{- $path := index . 1 -}}{{- $ca := index . 2 -}}
clientConfig:
  {{- if $root.Values.webhook.url }}
  url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) $path | quote }}
  {{- else }}
  service:
    name: {{ include "tessera.webhookService" $root }}
    namespace: {{ $root.Release.Namespace }}
    path: {{ $path | quote }}
    port: 443
  {{- end }}
  {{- if $ca }}
  caBundle: {{ $ca }}
  {{- end }}
{{- end -}}

{{- define "tessera.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ concat (list .Release.Namespace) .Values.webhook.exemptNamespaces | uniq | toJson }}
    - key: tessera.io/webhook
      operator: NotIn
      values: ["disabled"]
{{- end -}}
