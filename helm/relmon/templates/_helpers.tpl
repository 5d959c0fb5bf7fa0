{{/*
Names. Kubernetes names are at most 63 characters: every name is truncated.
*/}}
{{- define "relmon.name" -}}
{{- default "relmon" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "relmon.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "relmon.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "relmon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "relmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "relmon.labels" -}}
helm.sh/chart: {{ include "relmon.chart" . }}
{{ include "relmon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: relmon
{{- end }}

{{- define "relmon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "relmon.fullname" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "relmon.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- include "relmon.fullname" . }}
{{- end }}
{{- end }}

{{- define "relmon.hasSecret" -}}
{{- if or .Values.secret.existingSecret .Values.secret.create }}true{{ end }}
{{- end }}

{{/*
Checks that cannot be expressed in values.schema.json alone (also enforced there where
possible): SQLite is single-writer, so more than one replica needs the Kafka backend.
*/}}
{{- define "relmon.validate" -}}
{{- if and (eq .Values.review.backend "http") (gt (int .Values.replicaCount) 1) }}
{{- fail "replicaCount > 1 needs review.backend: kafka (the HTTP review backend keeps its state in SQLite, which has a single writer)" }}
{{- end }}
{{- if and .Values.persistence.enabled (not .Values.persistence.existingClaim) (or (gt (int .Values.replicaCount) 1) .Values.keda.enabled) }}
{{- fail "persistence.enabled with several replicas: one claim cannot hold several pods' state (with the Kafka review backend the state is replayed from the topics; leave persistence off)" }}
{{- end }}
{{- if and .Values.keda.enabled (eq .Values.review.backend "http") }}
{{- fail "keda.enabled scales replicas and needs review.backend: kafka" }}
{{- end }}
{{- if and .Values.keda.enabled (not .Values.kafka.enabled) }}
{{- fail "keda.enabled scales on Kafka consumer lag and needs kafka.enabled: true" }}
{{- end }}
{{- if and (eq .Values.review.backend "kafka") (not .Values.kafka.enabled) }}
{{- fail "review.backend: kafka needs kafka.enabled: true" }}
{{- end }}
{{- if and (eq .Values.traffic.mode "proxy") (not .Values.traffic.upstreamUrl) }}
{{- fail "traffic.mode: proxy needs traffic.upstreamUrl" }}
{{- end }}
{{- if and (eq .Values.review.backend "http") (not .Values.secret.create) (not .Values.secret.existingSecret) }}
{{- fail "the HTTP review backend needs a token file: keep secret.create or set secret.existingSecret" }}
{{- end }}
{{- $k := .Values.kafka }}
{{- $sasl := has $k.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") }}
{{- if and $sasl (not (and $k.sasl.mechanism $k.sasl.username)) }}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.mechanism and kafka.sasl.username" $k.securityProtocol) }}
{{- end }}
{{- if and $sasl (not .Values.secret.existingSecret) (not (and .Values.secret.create .Values.secret.kafkaSaslPassword)) }}
{{- fail "a SASL kafka.securityProtocol needs the password: secret.kafkaSaslPassword (with secret.create), or secret.existingSecret with the key kafka-sasl-password" }}
{{- end }}
{{- if and (or $k.sasl.mechanism $k.sasl.username) (not $sasl) }}
{{- fail "kafka.sasl is set but kafka.securityProtocol is not SASL_PLAINTEXT or SASL_SSL" }}
{{- end }}
{{- if and $k.tls.existingSecret (not (include "relmon.kafkaTls" .)) }}
{{- fail "kafka.tls.existingSecret is set but kafka.securityProtocol is not SSL or SASL_SSL" }}
{{- end }}
{{- if ne (empty $k.tls.certKey) (empty $k.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together (mutual TLS needs the certificate and its key)" }}
{{- end }}
{{- if and $k.tls.certKey (not $k.tls.existingSecret) }}
{{- fail "kafka.tls.certKey needs kafka.tls.existingSecret (the Secret holding the client certificate)" }}
{{- end }}
{{- if and (eq .Values.mode "standalone") (eq .Values.traffic.mode "off") (not .Values.kafka.enabled) }}
{{- fail "standalone relmon needs a traffic source: traffic.mode mirror/proxy or kafka.enabled" }}
{{- end }}
{{- end }}

{{/*
"true" when Kafka is reached over TLS (securityProtocol SSL or SASL_SSL).
*/}}
{{- define "relmon.kafkaTls" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{/*
"true" when the Kafka TLS Secret is mounted at /etc/relmon/kafka-tls.
*/}}
{{- define "relmon.kafkaTlsMounted" -}}
{{- if and .Values.kafka.tls.existingSecret (include "relmon.kafkaTls" .) }}true{{ end }}
{{- end }}

{{/*
relmon.yaml's kafka section: topics, security (files from the Secrets), group timeouts.
*/}}
{{- define "relmon.kafkaConfig" -}}
{{- $k := .Values.kafka }}
{{- $kafka := dict "enabled" $k.enabled "bootstrap_servers" $k.bootstrapServers "traffic_topic" $k.trafficTopic "dead_letter_topic" $k.deadLetterTopic "group_id" $k.groupId "review_topic" $k.reviewTopic "verdict_topic" $k.verdictTopic "verdict_dead_letter_topic" $k.verdictDeadLetterTopic "verdict_wait_s" $k.verdictWaitSeconds "security_protocol" $k.securityProtocol }}
{{- if include "relmon.kafkaTls" . }}
{{- $tls := dict "check_hostname" $k.tls.checkHostname }}
{{- if and (include "relmon.kafkaTlsMounted" .) $k.tls.caKey }}
{{- $_ := set $tls "ca_file" (printf "/etc/relmon/kafka-tls/%s" $k.tls.caKey) }}
{{- end }}
{{- if and (include "relmon.kafkaTlsMounted" .) $k.tls.certKey }}
{{- $_ := set $tls "cert_file" (printf "/etc/relmon/kafka-tls/%s" $k.tls.certKey) }}
{{- $_ := set $tls "key_file" (printf "/etc/relmon/kafka-tls/%s" $k.tls.keyKey) }}
{{- end }}
{{- $_ := set $kafka "tls" $tls }}
{{- end }}
{{- if has $k.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") }}
{{- $_ := set $kafka "sasl" (dict "mechanism" $k.sasl.mechanism "username" $k.sasl.username "password_file" "/etc/relmon/secrets/kafka-sasl-password") }}
{{- end }}
{{- range $name, $field := dict "sessionTimeoutMs" "session_timeout_ms" "heartbeatIntervalMs" "heartbeat_interval_ms" "maxPollIntervalMs" "max_poll_interval_ms" "rebalanceTimeoutMs" "rebalance_timeout_ms" }}
{{- if not (kindIs "invalid" (index $k $name)) }}
{{- $_ := set $kafka $field (int (index $k $name)) }}
{{- end }}
{{- end }}
{{- toYaml $kafka }}
{{- end }}

{{/*
relmon.yaml: the user's config with the chart-managed keys set from the values.
*/}}
{{- define "relmon.configFile" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "metrics" (dict "host" .Values.listenHost "port" (int .Values.ports.metrics)) }}
{{- $review := dict "backend" .Values.review.backend "host" .Values.listenHost "port" (int .Values.ports.review) }}
{{- if and (eq .Values.review.backend "http") (include "relmon.hasSecret" .) }}
{{- $_ := set $review "token_file" "/etc/relmon/secrets/review-token" }}
{{- end }}
{{- $_ := set $cfg "review" $review }}
{{- $traffic := dict "mode" .Values.traffic.mode "host" .Values.listenHost "port" (int .Values.ports.traffic) }}
{{- if .Values.traffic.upstreamUrl }}
{{- $_ := set $traffic "upstream_url" .Values.traffic.upstreamUrl }}
{{- end }}
{{- $_ := set $cfg "traffic" $traffic }}
{{- $_ := set $cfg "kafka" (include "relmon.kafkaConfig" . | fromYaml) }}
{{- $_ := set $cfg "state_dir" "/var/lib/relmon" }}
{{- if and .Values.secret.create (not .Values.secret.existingSecret) }}
{{- $_ := set $cfg "query_hash_key_file" "/etc/relmon/secrets/query-hash-key" }}
{{- end }}
{{- $_ := set $cfg "log_format" "json" }}
{{- $_ := set $cfg "drain_timeout_s" (int .Values.drainTimeoutSeconds) }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The relmon container. Used by the standalone Deployment, and by application charts as
a sidecar:  {{ include "relmon.sidecar" .Subcharts.relmon | nindent 8 }}
(with relmon as a dependency of the application chart, mode: sidecar), next to
{{ include "relmon.sidecar.volumes" .Subcharts.relmon | nindent 8 }} in its volumes.
*/}}
{{/*
The readiness probe's path. /readyz is 503 while monitoring is stopped (an open or
half-open circuit breaker, a broker gone); /readyz/traffic only while relmon starts or
stops. /readyz is used only where relmon pulls its traffic from Kafka (standalone,
traffic.mode "off"): readiness does not stop a consumer, so the next event still comes,
its first call is the circuit breaker's trial and monitoring recovers by itself.
Everything fed through a Service or a pod uses /readyz/traffic:
- mirror (the default): an unready pod is removed from the Service, mirrored copies stop
  arriving, no item means no trial call, so the circuit never closes and the pod never
  becomes ready again (and reviewers lose the review API on the same Service);
- proxy: relmon is in the live path, the application's traffic would stop too;
- sidecar: its readiness is its whole pod's, the application's.
*/}}
{{- define "relmon.readinessPath" -}}
{{- if .Values.probes.readinessPath -}}
{{ .Values.probes.readinessPath }}
{{- else if and (eq .Values.mode "standalone") (eq .Values.traffic.mode "off") -}}
/readyz
{{- else -}}
/readyz/traffic
{{- end -}}
{{- end -}}

{{- define "relmon.sidecar" -}}
- name: relmon
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["run", "--config", "/etc/relmon/relmon.yaml"]
  ports:
    - name: relmon-metrics
      containerPort: {{ .Values.ports.metrics }}
      protocol: TCP
    - name: relmon-review
      containerPort: {{ .Values.ports.review }}
      protocol: TCP
    {{- if ne .Values.traffic.mode "off" }}
    - name: relmon-traffic
      containerPort: {{ .Values.ports.traffic }}
      protocol: TCP
    {{- end }}
  {{- with .Values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  startupProbe:
    httpGet:
      path: /healthz
      port: relmon-metrics
    periodSeconds: 2
    failureThreshold: {{ div (int .Values.probes.startupTimeoutSeconds) 2 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: relmon-metrics
    periodSeconds: {{ .Values.probes.livenessPeriodSeconds }}
    timeoutSeconds: 5
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: {{ include "relmon.readinessPath" . }}
      port: relmon-metrics
    periodSeconds: {{ .Values.probes.readinessPeriodSeconds }}
    timeoutSeconds: 5
    failureThreshold: 3
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: relmon-config
      mountPath: /etc/relmon/relmon.yaml
      subPath: relmon.yaml
      readOnly: true
    {{- if include "relmon.hasSecret" . }}
    - name: relmon-secrets
      mountPath: /etc/relmon/secrets
      readOnly: true
    {{- end }}
    {{- if include "relmon.kafkaTlsMounted" . }}
    - name: relmon-kafka-tls
      mountPath: /etc/relmon/kafka-tls
      readOnly: true
    {{- end }}
    - name: relmon-state
      mountPath: /var/lib/relmon
    - name: relmon-tmp
      mountPath: /tmp
{{- end }}

{{- define "relmon.sidecar.volumes" -}}
- name: relmon-config
  configMap:
    name: {{ include "relmon.fullname" . }}
{{- if include "relmon.hasSecret" . }}
- name: relmon-secrets
  secret:
    secretName: {{ include "relmon.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- if include "relmon.kafkaTlsMounted" . }}
- name: relmon-kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
- name: relmon-state
{{- if and .Values.persistence.enabled (eq .Values.mode "standalone") }}
  persistentVolumeClaim:
    claimName: {{ .Values.persistence.existingClaim | default (printf "%s-state" (include "relmon.fullname" .)) }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: relmon-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- end }}
