{{/*
Helpers shared by every template. Each one takes the oncegate chart's own
context: `.` inside this chart, `.Subcharts.oncegate` from a parent chart, so
names, values and the image resolve the same way from both places.
*/}}

{{/* The chart name, overridable with nameOverride. */}}
{{- define "oncegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The release-qualified name every resource is named after. */}}
{{- define "oncegate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* fullname plus a suffix, still at most 63 characters: (list . "suffix"). */}}
{{- define "oncegate.suffixedName" -}}
{{- $ctx := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $base := include "oncegate.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end }}

{{- define "oncegate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "oncegate.labels" -}}
helm.sh/chart: {{ include "oncegate.chart" . }}
{{ include "oncegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: oncegate
{{- end }}

{{- define "oncegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "oncegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector of the example consumer pods. */}}
{{- define "oncegate.exampleSelectorLabels" -}}
{{ include "oncegate.selectorLabels" . }}
app.kubernetes.io/component: consumer
{{- end }}

{{/*
Labels of the pods that carry the sidecar, selected by the metrics Service,
the PodDisruptionBudget and the NetworkPolicy: targetPodLabels when set (the
sidecar lives in another chart's pods), else the example Deployment's pods.
*/}}
{{- define "oncegate.targetPodLabels" -}}
{{- if .Values.targetPodLabels -}}
{{ toYaml .Values.targetPodLabels }}
{{- else -}}
{{ include "oncegate.exampleSelectorLabels" . }}
{{- end -}}
{{- end }}

{{/* image reference: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "oncegate.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end }}

{{/* host:port, bracketing an IPv6 host: (list "::" 50052) -> [::]:50052 */}}
{{- define "oncegate.hostPort" -}}
{{- $host := index . 0 -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%v" $host (index . 1) -}}
{{- else -}}
{{- printf "%s:%v" $host (index . 1) -}}
{{- end -}}
{{- end }}

{{/* "true" when the Gate listens on loopback only (the sidecar default). */}}
{{- define "oncegate.gateIsLoopback" -}}
{{- $a := .Values.gate.bindAddress -}}
{{- if or (hasPrefix "127." $a) (eq $a "::1") -}}true{{- end -}}
{{- end }}

{{/* "true" when a Postgres URL is configured (else the embedded SQLite store). */}}
{{- define "oncegate.databaseEnabled" -}}
{{- if or .Values.database.existingSecret .Values.database.insecureDemoUrl -}}true{{- end -}}
{{- end }}

{{/* "true" when the sidecar must not migrate on start: a migration Job does it. */}}
{{- define "oncegate.migrationJobEnabled" -}}
{{- if and .Values.migration.enabled (include "oncegate.databaseEnabled" .) -}}true{{- end -}}
{{- end }}

{{/* "true" when this chart renders the demo Secret (plain URLs chosen on purpose). */}}
{{- define "oncegate.demoSecretEnabled" -}}
{{- if or .Values.database.insecureDemoUrl .Values.redis.insecureDemoUrl -}}true{{- end -}}
{{- end }}

{{- define "oncegate.demoSecretName" -}}
{{- include "oncegate.suffixedName" (list . "demo-urls") -}}
{{- end }}

{{/* valueFrom for DATABASE_URL: the existing Secret, else the demo Secret. */}}
{{- define "oncegate.databaseUrlFrom" -}}
valueFrom:
  secretKeyRef:
    {{- if .Values.database.existingSecret }}
    name: {{ .Values.database.existingSecret }}
    key: {{ .Values.database.existingSecretKey }}
    {{- else }}
    name: {{ include "oncegate.demoSecretName" . }}
    key: database-url
    {{- end }}
{{- end }}

{{- define "oncegate.redisUrlFrom" -}}
valueFrom:
  secretKeyRef:
    {{- if .Values.redis.existingSecret }}
    name: {{ .Values.redis.existingSecret }}
    key: {{ .Values.redis.existingSecretKey }}
    {{- else }}
    name: {{ include "oncegate.demoSecretName" . }}
    key: redis-url
    {{- end }}
{{- end }}

{{/* The directory holding the SQLite file (and its -wal/-shm companions). */}}
{{- define "oncegate.sqliteDir" -}}
{{- dir .Values.sqlite.path -}}
{{- end }}

{{- define "oncegate.dataClaimName" -}}
{{- .Values.sqlite.persistence.existingClaim | default (include "oncegate.suffixedName" (list . "data")) -}}
{{- end }}

{{/*
Locked-down security context of every container this chart renders: non-root,
read-only root filesystem, no capabilities, no privilege escalation, seccomp
RuntimeDefault. Only the uid/gid are values (null omits them, e.g. where the
platform assigns ids).
*/}}
{{- define "oncegate.containerSecurityContext" -}}
runAsNonRoot: true
{{- with .Values.securityContext.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.securityContext.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Pod-level security context of the pods this chart renders. */}}
{{- define "oncegate.podSecurityContext" -}}
runAsNonRoot: true
{{- with .Values.securityContext.runAsUser }}
runAsUser: {{ . }}
{{- end }}
{{- with .Values.securityContext.runAsGroup }}
runAsGroup: {{ . }}
{{- end }}
{{- with .Values.securityContext.fsGroup }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Checks that fail the render with a message naming the value. Renders nothing
on success; the sidecar template calls it, so a parent chart gets it too.
*/}}
{{- define "oncegate.validate" -}}
{{- $v := .Values -}}
{{- if and $v.database.existingSecret $v.database.insecureDemoUrl -}}
{{- fail "oncegate: set either database.existingSecret or database.insecureDemoUrl, not both" -}}
{{- end -}}
{{- if and $v.redis.existingSecret $v.redis.insecureDemoUrl -}}
{{- fail "oncegate: set either redis.existingSecret or redis.insecureDemoUrl, not both" -}}
{{- end -}}
{{- if and $v.tls.enabled (not $v.tls.secretName) -}}
{{- fail "oncegate: tls.enabled needs tls.secretName (a Secret with the certificate and key)" -}}
{{- end -}}
{{- if and (not (include "oncegate.gateIsLoopback" .)) (not $v.tls.enabled) -}}
{{- fail (printf "oncegate: gate.bindAddress %s listens beyond the pod; enable tls (tls.enabled, tls.secretName) or keep 127.0.0.1" $v.gate.bindAddress) -}}
{{- end -}}
{{- $drain := add $v.preStopSleepSeconds $v.shutdownGraceSeconds 5 -}}
{{- if lt (int $v.terminationGracePeriodSeconds) (int $drain) -}}
{{- fail (printf "oncegate: terminationGracePeriodSeconds (%v) must be at least preStopSleepSeconds + shutdownGraceSeconds + 5 = %v, or the drain is cut short" $v.terminationGracePeriodSeconds $drain) -}}
{{- end -}}
{{- end }}
