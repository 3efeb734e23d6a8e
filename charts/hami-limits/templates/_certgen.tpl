{{/*
RBAC for hami-certgen: create the one Secret and update it by name; read and update the one
MutatingWebhookConfiguration by name. `create` cannot be limited by resourceNames (the name is not
known to the authorizer before the object exists).
Call with (dict "ctx" $ "name" NAME "hook" true|false).
*/}}
{{- define "hami-limits.certgenRbac" -}}
{{- $ctx := .ctx -}}
{{- $hookAnnotations := dict -}}
{{- if .hook -}}
{{- $hookAnnotations = dict "helm.sh/hook" "pre-install,pre-upgrade,pre-rollback,post-install,post-upgrade,post-rollback" "helm.sh/hook-weight" "-20" "helm.sh/hook-delete-policy" "before-hook-creation,hook-succeeded" -}}
{{- end -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "hami-limits.labels" (dict "ctx" $ctx "component" "certgen") | nindent 4 }}
  {{- with $hookAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "hami-limits.labels" (dict "ctx" $ctx "component" "certgen") | nindent 4 }}
  {{- with $hookAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  - apiGroups: [""]
    resources: [secrets]
    verbs: [create]
  - apiGroups: [""]
    resources: [secrets]
    resourceNames: [{{ include "hami-limits.tlsSecretName" $ctx | quote }}]
    verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ .name }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "hami-limits.labels" (dict "ctx" $ctx "component" "certgen") | nindent 4 }}
  {{- with $hookAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $ctx.Release.Namespace }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  labels:
    {{- include "hami-limits.labels" (dict "ctx" $ctx "component" "certgen") | nindent 4 }}
  {{- with $hookAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
rules:
  - apiGroups: [admissionregistration.k8s.io]
    resources: [mutatingwebhookconfigurations]
    resourceNames: [{{ include "hami-limits.webhookConfigName" $ctx | quote }}]
    verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "hami-limits.labels" (dict "ctx" $ctx "component" "certgen") | nindent 4 }}
  {{- with $hookAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .name }}
    namespace: {{ $ctx.Release.Namespace }}
{{- end -}}

{{/* One hami-certgen container. Call with (dict "ctx" $ "name" CONTAINER "command" "create"|"patch"). */}}
{{- define "hami-limits.certgenContainer" -}}
{{- $ctx := .ctx -}}
{{- $c := $ctx.Values.certs -}}
- name: {{ .name }}
  image: {{ include "hami-limits.image" (dict "ctx" $ctx "image" $c.certgen.image) }}
  imagePullPolicy: {{ $c.certgen.image.pullPolicy }}
  args:
    - {{ .command }}
    - --namespace={{ $ctx.Release.Namespace }}
    - --secret-name={{ include "hami-limits.tlsSecretName" $ctx }}
    {{- if eq .command "create" }}
    - --service={{ include "hami-limits.webhookName" $ctx }}
    - --cluster-domain={{ $c.clusterDomain }}
    - --ca-days={{ $c.caDays }}
    - --cert-days={{ $c.certDays }}
    - --renew-before-days={{ $c.renewBeforeDays }}
    {{- else }}
    - --webhook-name={{ include "hami-limits.webhookConfigName" $ctx }}
    {{- end }}
    {{- range $c.certgen.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: HAMI_LOG_FORMAT
      value: {{ $ctx.Values.webhook.logFormat | quote }}
    {{- with $c.certgen.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  securityContext:
    {{- include "hami-limits.overlay" (dict "base" (fromYaml (include "hami-limits.restrictedContainerSecurity" $ctx)) "override" $c.certgen.securityContext) | nindent 4 }}
  resources:
    {{- toYaml $c.certgen.resources | nindent 4 }}
{{- end -}}

{{/* The pod template metadata of the certgen Jobs and CronJob, at the indentation of `metadata:`. */}}
{{- define "hami-limits.certgenPodMetadata" -}}
metadata:
  labels:
    {{- include "hami-limits.podLabels" (dict "ctx" . "component" "certgen" "labels" .Values.certs.certgen.podLabels) | nindent 4 }}
  {{- with include "hami-limits.podAnnotations" (dict "extra" .Values.certs.certgen.podAnnotations) }}{{ . | nindent 2 }}{{ end }}
{{- end -}}

{{/* Pod spec fields shared by the certgen Jobs and CronJob. */}}
{{- define "hami-limits.certgenPodSpec" -}}
{{- $c := .Values.certs.certgen -}}
restartPolicy: OnFailure
securityContext:
  {{- include "hami-limits.overlay" (dict "base" (fromYaml (include "hami-limits.nonRootPodSecurity" .)) "override" $c.podSecurityContext) | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
