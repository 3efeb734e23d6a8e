{{/* Object name prefix. */}}
{{- define "hami-limits.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami-limits.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object; pass (dict "ctx" $ "component" "webhook"). */}}
{{- define "hami-limits.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: hami-limits
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
{{ include "hami-limits.selectorLabels" . }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hami-limits.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami-limits.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "hami-limits.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{- define "hami-limits.webhookName" -}}{{ include "hami-limits.fullname" . }}-webhook{{- end -}}
{{- define "hami-limits.webhookConfigName" -}}{{ include "hami-limits.fullname" . }}{{- end -}}
{{- define "hami-limits.devicePluginName" -}}{{ include "hami-limits.fullname" . }}-device-plugin{{- end -}}
{{- define "hami-limits.certgenName" -}}{{ include "hami-limits.fullname" . }}-certgen{{- end -}}
{{- define "hami-limits.tlsSecretName" -}}{{ default (printf "%s-webhook-tls" (include "hami-limits.fullname" .)) .Values.certs.secretName }}{{- end -}}

{{/* The `nvidia:` section of HAMi's device-config.yaml, from devicePlugin values. */}}
{{- define "hami-limits.nvidiaSection" -}}
{{- $d := .Values.devicePlugin -}}
nvidia:
  resourceCountName: {{ $d.resourceCountName | quote }}
  resourceMemoryName: {{ $d.resourceMemoryName | quote }}
  resourceMemoryPercentageName: {{ $d.resourceMemoryPercentageName | quote }}
  resourceCoreName: {{ $d.resourceCoreName | quote }}
  resourcePriorityName: {{ $d.resourcePriorityName | quote }}
  defaultMemory: {{ $d.defaultMemory | int64 }}
  defaultCores: {{ $d.defaultCores | int64 }}
  defaultGPUNum: {{ $d.defaultGpuNum | int64 }}
  memoryFactor: {{ $d.memoryFactor | int64 }}
  overwriteEnv: {{ $d.overwriteEnv }}
  deviceSplitCount: {{ $d.deviceSplitCount | int64 }}
  deviceMemoryScaling: {{ $d.deviceMemoryScaling }}
  deviceCoreScaling: {{ $d.deviceCoreScaling }}
  gpuCorePolicy: {{ $d.gpuCorePolicy | quote }}
  {{- if not (kindIs "invalid" $d.libCudaLogLevel) }}
  libCudaLogLevel: {{ $d.libCudaLogLevel | int64 }}
  {{- end }}
  disableCoreLimit: {{ $d.disableCoreLimit }}
  limitDelivery: {{ $d.limitDelivery | quote }}
{{- end -}}

{{/* Pod-level security context for non-root components. */}}
{{- define "hami-limits.nonRootPodSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "hami-limits.restrictedContainerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* A list rendered as CEL string literals: 'a', 'b'. */}}
{{- define "hami-limits.quotedList" -}}
{{- $out := list -}}
{{- range . -}}{{- $out = append $out (printf "'%s'" .) -}}{{- end -}}
{{- join ", " $out -}}
{{- end -}}
