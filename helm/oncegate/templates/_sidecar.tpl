{{/*
oncegate.sidecar renders the oncegate sidecar container (one list item) and
oncegate.volumes the pod volumes it mounts. Both take the oncegate chart's
own context:

  in this chart:    {{- include "oncegate.sidecar" . | nindent 8 }}
  in a parent chart that depends on oncegate (see README.md):
    containers:
      - name: my-consumer
        ...
      {{- include "oncegate.sidecar" .Subcharts.oncegate | nindent 6 }}
    volumes:
      {{- include "oncegate.volumes" .Subcharts.oncegate | nindent 6 }}

With nativeSidecar=true the container carries restartPolicy: Always and goes
under initContainers instead (Kubernetes native sidecar: started before and
stopped after the consumer).
*/}}
{{- define "oncegate.sidecar" -}}
{{- include "oncegate.validate" . -}}
{{- $v := .Values -}}
- name: oncegate
  image: {{ include "oncegate.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $v.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  args:
    - serve
  env:
    - name: ONCEGATE_LISTEN
      value: {{ include "oncegate.hostPort" (list $v.gate.bindAddress $v.gate.port) | quote }}
    - name: ONCEGATE_HEALTH_LISTEN
      value: {{ include "oncegate.hostPort" (list $v.health.bindAddress $v.health.port) | quote }}
    - name: ONCEGATE_METRICS_LISTEN
      value: {{ include "oncegate.hostPort" (list $v.metrics.bindAddress $v.metrics.port) | quote }}
    {{- /* Postgres: the schema owner migrates (the Job, or you); the sidecar's role
    cannot, and must not be able to. SQLite: each pod migrates its own file. */}}
    - name: ONCEGATE_MIGRATE_ON_START
      value: {{ ternary "false" "true" (eq (include "oncegate.databaseEnabled" .) "true") | quote }}
    - name: ONCEGATE_SHUTDOWN_GRACE
      value: {{ printf "%vs" $v.shutdownGraceSeconds | quote }}
    - name: ONCEGATE_LOG_FORMAT
      value: {{ $v.logFormat | quote }}
    - name: RUST_LOG
      value: {{ $v.logLevel | quote }}
    - name: ONCEGATE_INSTANCE_ID
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: ONCEGATE_RETENTION
      value: {{ $v.retention | quote }}
    {{- if include "oncegate.databaseEnabled" . }}
    - name: DATABASE_URL
      {{- include "oncegate.databaseUrlFrom" . | nindent 6 }}
    # exit 64 at start when the role is privileged (owner, superuser, UPDATE/DELETE on the trail)
    - name: ONCEGATE_REQUIRE_LEAST_PRIVILEGE
      value: "true"
    - name: ONCEGATE_DB_POOL_SIZE
      value: {{ $v.database.poolSize | quote }}
    # claims refused (UNAVAILABLE, Gate NOT_SERVING) while no synchronous standby confirms commits
    - name: ONCEGATE_REQUIRE_SYNC_REPLICA
      value: {{ $v.database.requireSyncReplica | quote }}
    {{- else }}
    - name: ONCEGATE_SQLITE_PATH
      value: {{ $v.sqlite.path | quote }}
    {{- end }}
    {{- if or $v.redis.existingSecret $v.redis.insecureDemoUrl }}
    - name: REDIS_URL
      {{- include "oncegate.redisUrlFrom" . | nindent 6 }}
    {{- end }}
    {{- if $v.relay.existingSecret }}
    - name: ONCEGATE_RELAY_SINK
      valueFrom:
        secretKeyRef:
          name: {{ $v.relay.existingSecret }}
          key: {{ $v.relay.existingSecretKey }}
    {{- else }}
    - name: ONCEGATE_RELAY_SINK
      value: {{ $v.relay.sink | quote }}
    {{- end }}
    - name: ONCEGATE_RELAY_STREAM
      value: {{ $v.relay.stream | quote }}
    - name: ONCEGATE_RELAY_SLOTS
      value: {{ $v.relay.slots | quote }}
    {{- if $v.relay.kafka.transactionalIdPrefix }}
    - name: ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX
      value: {{ $v.relay.kafka.transactionalIdPrefix | quote }}
    {{- end }}
    {{- if $v.audit.spool.enabled }}
    - name: ONCEGATE_AUDIT_SPOOL_DIR
      value: {{ $v.audit.spool.mountPath | quote }}
    {{- end }}
    {{- if $v.audit.anchors.existingClaim }}
    - name: ONCEGATE_AUDIT_ANCHOR_FILE
      value: {{ printf "%s/$(ONCEGATE_INSTANCE_ID).jsonl" $v.audit.anchors.mountPath | quote }}
    {{- end }}
    {{- if $v.tls.enabled }}
    - name: ONCEGATE_TLS_CERT
      value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.certKey | quote }}
    - name: ONCEGATE_TLS_KEY
      value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.keyKey | quote }}
    {{- if $v.tls.clientAuth }}
    - name: ONCEGATE_TLS_CLIENT_CA
      value: {{ printf "%s/%s" $v.tls.mountPath $v.tls.caKey | quote }}
    {{- end }}
    {{- end }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    {{- if not (include "oncegate.gateIsLoopback" .) }}
    - name: og-grpc
      containerPort: {{ $v.gate.port }}
      protocol: TCP
    {{- end }}
    - name: og-health
      containerPort: {{ $v.health.port }}
      protocol: TCP
    - name: og-metrics
      containerPort: {{ $v.metrics.port }}
      protocol: TCP
  startupProbe:
    grpc:
      port: {{ $v.health.port }}
      service: {{ $v.probes.startup.service | quote }}
    periodSeconds: {{ $v.probes.startup.periodSeconds }}
    timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
    failureThreshold: {{ $v.probes.startup.failureThreshold }}
  readinessProbe:
    grpc:
      port: {{ $v.health.port }}
      service: {{ $v.probes.readiness.service | quote }}
    periodSeconds: {{ $v.probes.readiness.periodSeconds }}
    timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
    failureThreshold: {{ $v.probes.readiness.failureThreshold }}
  livenessProbe:
    grpc:
      port: {{ $v.health.port }}
      service: {{ $v.probes.liveness.service | quote }}
    periodSeconds: {{ $v.probes.liveness.periodSeconds }}
    timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
    failureThreshold: {{ $v.probes.liveness.failureThreshold }}
  {{- if gt (int $v.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      sleep:
        seconds: {{ $v.preStopSleepSeconds }}
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- include "oncegate.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - name: oncegate-tmp
      mountPath: /tmp
    {{- if not (include "oncegate.databaseEnabled" .) }}
    - name: oncegate-data
      mountPath: {{ include "oncegate.sqliteDir" . }}
    {{- end }}
    {{- if $v.tls.enabled }}
    - name: oncegate-tls
      mountPath: {{ $v.tls.mountPath }}
      readOnly: true
    {{- end }}
    {{- if $v.relay.kafka.tlsSecret }}
    - name: oncegate-kafka-tls
      mountPath: {{ $v.relay.kafka.mountPath }}
      readOnly: true
    {{- end }}
    {{- if $v.audit.spool.enabled }}
    - name: oncegate-audit-spool
      mountPath: {{ $v.audit.spool.mountPath }}
    {{- end }}
    {{- if $v.audit.anchors.existingClaim }}
    - name: oncegate-audit-anchors
      mountPath: {{ $v.audit.anchors.mountPath }}
    {{- end }}
{{- end }}

{{- define "oncegate.volumes" -}}
{{- $v := .Values -}}
- name: oncegate-tmp
  emptyDir:
    sizeLimit: {{ $v.tmpSizeLimit }}
{{- if not (include "oncegate.databaseEnabled" .) }}
- name: oncegate-data
  {{- if $v.sqlite.persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ include "oncegate.dataClaimName" . }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ $v.sqlite.emptyDirSizeLimit }}
  {{- end }}
{{- end }}
{{- if $v.tls.enabled }}
- name: oncegate-tls
  secret:
    secretName: {{ $v.tls.secretName }}
    defaultMode: {{ $v.tls.defaultMode }}
{{- end }}
{{- if $v.relay.kafka.tlsSecret }}
- name: oncegate-kafka-tls
  secret:
    secretName: {{ $v.relay.kafka.tlsSecret }}
    defaultMode: {{ $v.tls.defaultMode }}
{{- end }}
{{- if $v.audit.spool.enabled }}
- name: oncegate-audit-spool
  emptyDir:
    sizeLimit: {{ $v.audit.spool.sizeLimit }}
{{- end }}
{{- if $v.audit.anchors.existingClaim }}
- name: oncegate-audit-anchors
  persistentVolumeClaim:
    claimName: {{ $v.audit.anchors.existingClaim }}
{{- end }}
{{- end }}
