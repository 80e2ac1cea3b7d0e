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

{{/*
An alert's runbook_url annotation, (list base "AlertName"): the alert's section
of docs/OPERATING.md, whose heading is the alert's name (GitHub's anchor: the
name in lower case). Nothing when the base is empty.
*/}}
{{- define "oncegate.runbookUrl" -}}
{{- if index . 0 -}}
runbook_url: {{ printf "%s#%s" (index . 0) (lower (index . 1)) | quote }}
{{- end -}}
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

{{/* "true" when this chart renders the migration Job (Postgres and migration.enabled). */}}
{{- define "oncegate.migrationJobEnabled" -}}
{{- if and .Values.migration.enabled (include "oncegate.databaseEnabled" .) -}}true{{- end -}}
{{- end }}

{{/* "true" when the schema owner's credential (migration.database) is configured. */}}
{{- define "oncegate.migrationDatabaseSet" -}}
{{- if or .Values.migration.database.existingSecret .Values.migration.database.insecureDemoUrl -}}true{{- end -}}
{{- end }}

{{/* "true" when this chart renders a demo Secret (plain URLs chosen on purpose). */}}
{{- define "oncegate.demoSecretEnabled" -}}
{{- if or .Values.database.insecureDemoUrl .Values.redis.insecureDemoUrl .Values.migration.database.insecureDemoUrl -}}true{{- end -}}
{{- end }}

{{- define "oncegate.demoSecretName" -}}
{{- include "oncegate.suffixedName" (list . "demo-urls") -}}
{{- end }}

{{/* The demo Secret of the schema owner's URL (migration.database.insecureDemoUrl), for the Job only. */}}
{{- define "oncegate.demoOwnerSecretName" -}}
{{- include "oncegate.suffixedName" (list . "demo-owner-url") -}}
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

{{/*
valueFrom for the migration Job's DATABASE_URL: the schema owner's
credential (migration.database), never the application role's.
*/}}
{{- define "oncegate.migrationDatabaseUrlFrom" -}}
valueFrom:
  secretKeyRef:
    {{- if .Values.migration.database.existingSecret }}
    name: {{ .Values.migration.database.existingSecret }}
    key: {{ .Values.migration.database.existingSecretKey }}
    {{- else }}
    name: {{ include "oncegate.demoOwnerSecretName" . }}
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
{{- include "oncegate.honourRenamedValues" . -}}
{{- $v := .Values -}}
{{- if and $v.database.existingSecret $v.database.insecureDemoUrl -}}
{{- fail "oncegate: set either database.existingSecret or database.insecureDemoUrl, not both" -}}
{{- end -}}
{{- if and $v.migration.database.existingSecret $v.migration.database.insecureDemoUrl -}}
{{- fail "oncegate: set either migration.database.existingSecret or migration.database.insecureDemoUrl, not both" -}}
{{- end -}}
{{- if and (include "oncegate.migrationJobEnabled" .) (not (include "oncegate.migrationDatabaseSet" .)) -}}
{{- fail "oncegate: the migration Job runs as the schema owner: set migration.database.existingSecret (a Secret with the owner's postgres:// URL). database.existingSecret is the application role's URL, given to the sidecar only and never to the Job. Or set migration.enabled=false and run `oncegate migrate` as the owner yourself" -}}
{{- end -}}
{{- if and (include "oncegate.migrationDatabaseSet" .) (not (include "oncegate.databaseEnabled" .)) -}}
{{- fail "oncegate: migration.database is the schema owner's credential for migrating Postgres, but no Postgres is configured: set database.existingSecret (the application role's URL) too, or unset migration.database" -}}
{{- end -}}
{{- if and $v.database.existingSecret (eq $v.database.existingSecret $v.migration.database.existingSecret) (eq $v.database.existingSecretKey $v.migration.database.existingSecretKey) -}}
{{- fail (printf "oncegate: database and migration.database point at the same Secret key (%s/%s): the sidecar must not get the schema owner's credential; store the application role's URL under another key or Secret" $v.database.existingSecret $v.database.existingSecretKey) -}}
{{- end -}}
{{- if and $v.database.insecureDemoUrl (eq $v.database.insecureDemoUrl $v.migration.database.insecureDemoUrl) -}}
{{- fail "oncegate: database.insecureDemoUrl and migration.database.insecureDemoUrl are the same URL: the sidecar must not get the schema owner's credential" -}}
{{- end -}}
{{- range $v.extraEnv -}}
{{- if has .name (list "DATABASE_URL" "ONCEGATE_REQUIRE_LEAST_PRIVILEGE" "ONCEGATE_MIGRATE_ON_START") -}}
{{- fail (printf "oncegate: extraEnv must not set %s; the chart sets it (database.*, migration.*)" .name) -}}
{{- end -}}
{{- $ref := dig "valueFrom" "secretKeyRef" "name" "" . -}}
{{- if and $ref (eq $ref $v.migration.database.existingSecret) (eq (dig "valueFrom" "secretKeyRef" "key" "" .) $v.migration.database.existingSecretKey) -}}
{{- fail (printf "oncegate: extraEnv %s references the schema owner's credential (migration.database.existingSecret %s); only the migration Job gets it" .name $ref) -}}
{{- end -}}
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
