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

{{/*
An image reference; pass (dict "ctx" $ "image" IMAGE), IMAGE = {repository, tag, digest}.
global.imageRegistry, when set, replaces the registry host of the repository (its first path
component when that has a "." or ":" or is "localhost": ghcr.io/hami-limits/hami-webhook ->
REGISTRY/hami-limits/hami-webhook) or is put in front of a repository without one (projecthami/hami
-> REGISTRY/projecthami/hami). With a digest the reference is REPOSITORY@DIGEST (the tag is not
used), else REPOSITORY:TAG (empty tag: the chart's appVersion).
*/}}
{{- define "hami-limits.image" -}}
{{- $repo := .image.repository -}}
{{- $registry := "" -}}
{{- with .ctx.Values.global }}{{ $registry = trimSuffix "/" (.imageRegistry | default "") }}{{ end -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
A map overlaid on another, as YAML: keys of `override` replace those of `base`; where both hold a
map, the two are overlaid the same way, one level further down; a null in `override` removes the
key. Unlike sprig's mergeOverwrite, false and 0 in `override` win (readOnlyRootFilesystem: false
is an override like any other). Pass (dict "base" MAP "override" MAP).
*/}}
{{- define "hami-limits.overlay" -}}
{{- $out := deepCopy (.base | default dict) -}}
{{- range $k, $v := (.override | default dict) -}}
{{- if kindIs "invalid" $v -}}
{{- $_ := unset $out $k -}}
{{- else if and (kindIs "map" $v) (kindIs "map" (index $out $k)) -}}
{{- $_ := set $out $k (fromYaml (include "hami-limits.overlay" (dict "base" (index $out $k) "override" $v))) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- if $out }}{{ toYaml $out }}{{ else }}{}{{ end -}}
{{- end -}}

{{/* A pod template's labels: the workload's podLabels, then its selector labels (which win: a
podLabels entry cannot detach the pods from their controller). Pass (dict "ctx" $ "component" C
"labels" MAP). */}}
{{- define "hami-limits.podLabels" -}}
{{- $selector := fromYaml (include "hami-limits.selectorLabels" .) -}}
{{- toYaml (merge $selector (deepCopy (.labels | default dict))) -}}
{{- end -}}

{{/* A pod template's annotations: the chart's own (checksums; they win) over the workload's
podAnnotations; nothing when both are empty. Pass (dict "own" MAP "extra" MAP). */}}
{{- define "hami-limits.podAnnotations" -}}
{{- $all := merge (deepCopy (.own | default dict)) (deepCopy (.extra | default dict)) -}}
{{- if $all -}}
annotations:
  {{- toYaml $all | nindent 2 }}
{{- end -}}
{{- end -}}

{{- define "hami-limits.webhookName" -}}{{ include "hami-limits.fullname" . }}-webhook{{- end -}}
{{- define "hami-limits.webhookConfigName" -}}{{ include "hami-limits.fullname" . }}{{- end -}}
{{- define "hami-limits.devicePluginName" -}}{{ include "hami-limits.fullname" . }}-device-plugin{{- end -}}
{{- define "hami-limits.monitorName" -}}{{ include "hami-limits.fullname" . }}-vgpu-monitor{{- end -}}
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
  defaultGPUNum: {{ $d.defaultGpuNum | int64 }}
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
  {{- /* As HAMi's chart (scheduler/device-configmap.yaml) renders it. */}}
  enableNumaTopology: {{ $d.enableNumaTopology | default false }}
  {{- if gt (int64 $d.preConfiguredDeviceMemory) 0 }}
  preConfiguredDeviceMemory: {{ $d.preConfiguredDeviceMemory | int64 }}
  {{- end }}
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

{{/* Where the device plugin image carries the preload library (Dockerfile, stage device-plugin). */}}
{{- define "hami-limits.preloadLibrary" -}}/usr/local/lib/hami-limits/libhami_preload.so{{- end -}}

{{/* Where the inventory ConfigMap (devicePlugin.inventory) is mounted: the folder, and the file
`run --inventory` and `install-hook --inventory` read. */}}
{{- define "hami-limits.inventoryDir" -}}/etc/hami-limits/inventory{{- end -}}
{{- define "hami-limits.inventoryFile" -}}{{ include "hami-limits.inventoryDir" . }}/inventory.yaml{{- end -}}

{{/* The volume `inventory`: the ConfigMap <fullname>-inventory (configmaps.yaml renders it when
devicePlugin.inventory is set). */}}
{{- define "hami-limits.inventoryVolume" -}}
- name: inventory
  configMap:
    name: {{ include "hami-limits.fullname" . }}-inventory
{{- end -}}

{{/* The host folder KAI pods get as HAMi-core (webhook.yaml kai.hookPath, and what the hook
installer fills): webhook.kai.hookPath, else <devicePlugin.hookPath>/vgpu. One definition, so the
webhook and the hook installer cannot disagree. */}}
{{- define "hami-limits.kaiVgpuDir" -}}
{{- default (printf "%s/vgpu" (trimSuffix "/" .Values.devicePlugin.hookPath)) .Values.webhook.kai.hookPath -}}
{{- end -}}

{{/*
The two init containers that install HAMi-core and the preload library into <hookPath>/vgpu on the
host and publish the node GPU file there; pass (dict "ctx" $ "hookPath" HOOK "securityContext" MAP
"extraArgs" LIST "extraEnv" LIST): securityContext is overlaid on both containers' own, extraArgs
and extraEnv go to install-hook. The pod needs the volumes of "hami-limits.hookHandoffVolume", the
hostPath volume `hami-core` and, when devicePlugin.inventory is set, "hami-limits.inventoryVolume".
  1. copy-hami-core (HAMi's image; only `sh` and `cp` assumed): copies HAMi's library folder as it
     is (libvgpu.so or libvgpu.so.<version>, ld.so.preload, ...) into an emptyDir. Symbolic links
     stay links (-P), so that install-hook sees libvgpu.so -> libvgpu.so.<version> as one file, not
     two; ownership is not copied (root with no CAP_CHOWN could not);
  2. install-hook (our image): `hami-device-plugin install-hook` picks libvgpu.so out of it and
     installs it, libhami_preload.so, the node GPU file node-gpus (each GPU's minor number, UUID and
     MiB, for KAI gpu-fraction caps) and a generated ld.so.preload (preload library first) into
     HOOK/vgpu, atomically (copy, then rename: a library mapped by running processes is never
     overwritten in place) and idempotently. The GPUs come from NVML, which the NVIDIA runtime
     gives this container only (NVIDIA_VISIBLE_DEVICES=all, capability utility), or from
     devicePlugin.inventory (--inventory) when set. Without NVML it installs the libraries, leaves
     no node-gpus and warns.
*/}}
{{- define "hami-limits.hookInitContainers" -}}
{{- $ctx := .ctx -}}
{{- $core := $ctx.Values.devicePlugin.hamiCore -}}
{{- $hook := .hookPath -}}
{{- $rootInit := dict "runAsUser" 0 "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")) -}}
- name: copy-hami-core
  image: {{ include "hami-limits.image" (dict "ctx" $ctx "image" $core.image) }}
  imagePullPolicy: {{ $core.image.pullPolicy }}
  command: [/bin/sh, -c]
  args:
    - |
      set -eu
      [ -d "$HAMI_CORE_SOURCE_DIR" ] || { echo "copy-hami-core: $HAMI_CORE_SOURCE_DIR is not a folder in this image" >&2; exit 1; }
      cp -RPf "$HAMI_CORE_SOURCE_DIR/." /hami-core/
      echo "copy-hami-core: copied $HAMI_CORE_SOURCE_DIR"
  env:
    - name: HAMI_CORE_SOURCE_DIR
      value: {{ $core.sourceDir | quote }}
    # HAMi's image asks the NVIDIA runtime for every GPU; a copy needs none.
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  securityContext:
    {{- include "hami-limits.overlay" (dict "base" $rootInit "override" .securityContext) | nindent 4 }}
  resources:
    {{- toYaml $core.resources | nindent 4 }}
  volumeMounts:
    - name: hami-core-image
      mountPath: /hami-core
- name: install-hook
  image: {{ include "hami-limits.image" (dict "ctx" $ctx "image" $ctx.Values.devicePlugin.image) }}
  imagePullPolicy: {{ $ctx.Values.devicePlugin.image.pullPolicy }}
  args:
    - install-hook
    - --hami-core-dir=/hami-core
    - --preload={{ include "hami-limits.preloadLibrary" $ctx }}
    - --hook-path={{ $hook }}
    {{- if $ctx.Values.devicePlugin.inventory }}
    - --inventory={{ include "hami-limits.inventoryFile" $ctx }}
    {{- end }}
    {{- range .extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    # NVML (the node GPU file) through the NVIDIA runtime: every GPU, the utility capability only.
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- with .extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  # Root: <hookPath>/vgpu on the host is root-owned. Root without DAC_OVERRIDE can still write the
  # folders and files it owns.
  securityContext:
    {{- include "hami-limits.overlay" (dict "base" $rootInit "override" .securityContext) | nindent 4 }}
  resources:
    {{- toYaml $core.resources | nindent 4 }}
  volumeMounts:
    - name: hami-core-image
      mountPath: /hami-core
      readOnly: true
    # Container path = host path: ld.so.preload names the libraries by the path workloads see.
    - name: hami-core
      mountPath: {{ printf "%s/vgpu" (trimSuffix "/" $hook) }}
    {{- if $ctx.Values.devicePlugin.inventory }}
    - name: inventory
      mountPath: {{ include "hami-limits.inventoryDir" $ctx }}
      readOnly: true
    {{- end }}
{{- end -}}

{{/* The hand-off folder between the two init containers of "hami-limits.hookInitContainers" (the
pod also needs the hostPath volume `hami-core`: HOOK/vgpu, DirectoryOrCreate). HAMi's library
folder is a few MiB. */}}
{{- define "hami-limits.hookHandoffVolume" -}}
- name: hami-core-image
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "hami-limits.hookInstallerName" -}}{{ include "hami-limits.fullname" . }}-hook-installer{{- end -}}

{{/*
A Prometheus Operator ServiceMonitor scraping the `metrics` port of the component's Service (plain
HTTP /metrics). Pass (dict "ctx" $ "component" C "name" NAME "values" SERVICEMONITOR-VALUES). The
monitoring.coreos.com/v1 CRD must exist (Prometheus Operator, kube-prometheus-stack).
*/}}
{{- define "hami-limits.serviceMonitor" -}}
{{- $ctx := .ctx -}}
{{- $v := .values -}}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- /* serviceMonitor.labels add to the chart's labels (Prometheus' serviceMonitorSelector). */}}
    {{- toYaml (merge (fromYaml (include "hami-limits.labels" (dict "ctx" $ctx "component" .component))) (deepCopy ($v.labels | default dict))) | nindent 4 }}
spec:
  jobLabel: app.kubernetes.io/component
  namespaceSelector:
    matchNames: [{{ $ctx.Release.Namespace | quote }}]
  selector:
    matchLabels:
      {{- include "hami-limits.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  endpoints:
    {{- /* One endpoint per named Service port (`ports`, default [metrics]). */}}
    {{- range (.ports | default (list "metrics")) }}
    - port: {{ . }}
      path: /metrics
      scheme: http
      {{- with $v.interval }}
      interval: {{ . }}
      {{- end }}
      {{- with $v.scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
      honorLabels: {{ $v.honorLabels }}
      {{- with $v.relabelings }}
      relabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.metricRelabelings }}
      metricRelabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    {{- end }}
{{- end -}}

{{/* The ConfigMap holding device-config.yaml: an existing one (deviceConfig.existingConfigMap)
or the one this chart renders. */}}
{{- define "hami-limits.deviceConfigMapName" -}}
{{- .Values.deviceConfig.existingConfigMap | default (printf "%s-device-config" (include "hami-limits.fullname" .)) -}}
{{- end -}}

{{/* A configMap volume `name` presenting that ConfigMap's device config as device-config.yaml. */}}
{{- define "hami-limits.deviceConfigVolume" -}}
- name: {{ .name }}
  configMap:
    name: {{ include "hami-limits.deviceConfigMapName" .ctx }}
    {{- if .ctx.Values.deviceConfig.existingConfigMap }}
    items:
      - key: {{ .ctx.Values.deviceConfig.key | quote }}
        path: device-config.yaml
    {{- end }}
{{- end -}}

{{/* "true" when the chart installs its ValidatingAdmissionPolicies: admissionPolicy.enabled and an
API server that serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (Kubernetes 1.30
and later; `helm template` needs `--api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy`).
Empty otherwise: then the webhook's UPDATE entry enforces the same pod rules. */}}
{{- define "hami-limits.admissionPolicy" -}}
{{- if and .Values.admissionPolicy.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}

{{/* The device plugin's ServiceAccount as the API server names it in a request. */}}
{{- define "hami-limits.devicePluginUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "hami-limits.devicePluginName" . }}
{{- end -}}

{{/* The identities that may write HAMi's scheduler-owned pod annotations, as a JSON list:
admissionPolicy.schedulerIdentities, plus this chart's device plugin (it sets bind-phase and
empties its vgpu-devices-to-allocate entry). Read by the policy and by the webhook
(tenancy.schedulerAnnotationWriters). */}}
{{- define "hami-limits.schedulerAnnotationWriters" -}}
{{- $writers := .Values.admissionPolicy.schedulerIdentities | default list -}}
{{- if .Values.devicePlugin.enabled -}}
{{- $writers = append $writers (include "hami-limits.devicePluginUser" .) -}}
{{- end -}}
{{- $writers | uniq | toJson -}}
{{- end -}}

{{/* HAMi's scheduler-owned pod annotations (HAMi v2.10: the scheduler writes them, the device
plugin's Allocate reads them and trusts them; the webhook's list, hami_shared::names::
SCHEDULER_OWNED_ANNOTATIONS), and its pod label. */}}
{{- define "hami-limits.schedulerAnnotations" -}}
["hami.io/vgpu-node","hami.io/vgpu-devices-to-allocate","hami.io/vgpu-devices-allocated","hami.io/bind-phase","hami.io/bind-time","hami.io/vgpu-time","hami.io/vgpu-mig-allocations"]
{{- end -}}
{{- define "hami-limits.schedulerLabel" -}}hami.io/vgpu-node{{- end -}}

{{/*
The region exporter's flags (regionExport), for `run` and `serve-preload` alike.
*/}}
{{- define "hami-limits.regionExportArgs" -}}
{{- $r := .Values.regionExport -}}
- --region-interval={{ $r.interval }}
- --region-scrape-files={{ $r.scrapeFiles | int64 }}
- --region-scrape-budget-ms={{ $r.scrapeBudgetMs | int64 }}
{{- end -}}

{{/* kubelet's pod resources folder (hookInstaller.podResourcesDir), without a trailing slash. */}}
{{- define "hami-limits.podResourcesDir" -}}
{{ trimSuffix "/" .Values.hookInstaller.podResourcesDir }}
{{- end -}}
