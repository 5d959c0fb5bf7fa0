{{/*
relmon.yaml's kafka section: topics, limits, security (files from the Secrets), group
timeouts.
*/}}
{{- define "relmon.kafkaConfig" -}}
{{- $k := .Values.kafka }}
{{- $kafka := dict "enabled" $k.enabled "bootstrap_servers" $k.bootstrapServers "traffic_topic" $k.trafficTopic "dead_letter_topic" $k.deadLetterTopic "group_id" $k.groupId "review_topic" $k.reviewTopic "verdict_topic" $k.verdictTopic "verdict_dead_letter_topic" $k.verdictDeadLetterTopic "verdict_wait_s" $k.verdictWaitSeconds "max_event_bytes" (int $k.maxEventBytes) "security_protocol" $k.securityProtocol "auto_offset_reset" ($k.autoOffsetReset | default "earliest") }}
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
relmon.yaml's review section: listener, backend, who the reviewer is, leases.
*/}}
{{- define "relmon.reviewConfig" -}}
{{- $r := .Values.review }}
{{- $review := dict "backend" $r.backend "host" (include "relmon.reviewHost" .) "port" (int .Values.ports.review) }}
{{- if not (kindIs "invalid" $r.outboxMaxItems) }}
{{- $_ := set $review "outbox_max_items" (int $r.outboxMaxItems) }}
{{- end }}
{{- if include "relmon.reviewApi" . }}
{{- $_ := set $review "auth" $r.auth.mode }}
{{- $_ := set $review "lease_s" $r.leaseSeconds }}
{{- $_ := set $review "undo_s" $r.undoSeconds }}
{{- if not (kindIs "invalid" $r.maxLeasesPerReviewer) }}
{{- $_ := set $review "max_leases_per_reviewer" (int $r.maxLeasesPerReviewer) }}
{{- end }}
{{- with include "relmon.reviewTokenFile" . }}
{{- $_ := set $review "token_file" . }}
{{- end }}
{{- if and (include "relmon.reviewAuthMounted" .) $r.auth.tokensKey }}
{{- $_ := set $review "tokens_file" "/etc/relmon/review-auth/tokens" }}
{{- end }}
{{- with $r.auth.proxyHeaders }}
{{- $_ := set $review "proxy_headers" . }}
{{- end }}
{{- with $r.auth.trustedProxies }}
{{- $_ := set $review "trusted_proxies" . }}
{{- end }}
{{- end }}
{{- toYaml $review }}
{{- end }}

{{/*
relmon.yaml's traffic.otlp: the receiver's listener, and each setting only when given
(null or "": relmon's default).
*/}}
{{- define "relmon.otlpConfig" -}}
{{- $o := .Values.traffic.otlp }}
{{- $otlp := dict "enabled" true "host" (include "relmon.otlpHost" .) "port" (int .Values.ports.otlp) }}
{{- if $o.forwardTo }}
{{- $_ := set $otlp "forward_to" $o.forwardTo }}
{{- end }}
{{- range $name, $field := dict "maxBodyBytes" "max_body_bytes" "maxWaitingSpans" "max_waiting_spans" "queueSize" "queue_size" }}
{{- if not (kindIs "invalid" (index $o $name)) }}
{{- $_ := set $otlp $field (int (index $o $name)) }}
{{- end }}
{{- end }}
{{- range $name, $field := dict "forwardTimeoutSeconds" "forward_timeout_s" "joinSeconds" "join_s" }}
{{- if not (kindIs "invalid" (index $o $name)) }}
{{- $_ := set $otlp $field (index $o $name) }}
{{- end }}
{{- end }}
{{- toYaml $otlp }}
{{- end }}

{{/*
relmon.yaml: the user's config with the chart-managed keys set from the values.
*/}}
{{- define "relmon.configFile" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "metrics" (dict "host" (include "relmon.metricsHost" .) "port" (int .Values.ports.metrics)) }}
{{- $_ := set $cfg "review" (include "relmon.reviewConfig" . | fromYaml) }}
{{- $t := .Values.traffic }}
{{- $traffic := dict "mode" $t.mode "host" (include "relmon.trafficHost" .) "port" (int .Values.ports.traffic) "task_header" $t.taskHeader "max_body_bytes" (int $t.maxBodyBytes) }}
{{- if $t.upstreamUrl }}
{{- $_ := set $traffic "upstream_url" $t.upstreamUrl }}
{{- end }}
{{- range $name, $field := dict "upstreamConnectTimeoutSeconds" "upstream_connect_timeout_s" "upstreamReadTimeoutSeconds" "upstream_read_timeout_s" "clientSendTimeoutSeconds" "client_send_timeout_s" "upstreamPoolSize" "upstream_pool_size" "uvloop" "uvloop" "dataPlane" "data_plane" "offerBatchSeconds" "offer_batch_s" }}
{{- if not (kindIs "invalid" (index $t $name)) }}
{{- $_ := set $traffic $field (index $t $name) }}
{{- end }}
{{- end }}
{{- with $t.routes }}
{{- $_ := set $traffic "routes" . }}
{{- end }}
{{- if include "relmon.otlp" . }}
{{- $_ := set $traffic "otlp" (include "relmon.otlpConfig" . | fromYaml) }}
{{- end }}
{{- $_ := set $cfg "traffic" $traffic }}
{{- $_ := set $cfg "kafka" (include "relmon.kafkaConfig" . | fromYaml) }}
{{- $store := dict "backend" .Values.store.backend }}
{{- if eq .Values.store.backend "postgres" }}
{{- $_ := set $store "sync_s" .Values.store.syncSeconds }}
{{- if include "relmon.storeSecretMounted" . }}
{{- $_ := set $store "dsn_file" "/etc/relmon/store/dsn" }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "store" $store }}
{{- $_ := set $cfg "state_dir" "/var/lib/relmon" }}
{{- if and (include "relmon.createsSecret" .) .Values.secret.queryHashKey }}
{{- $_ := set $cfg "query_hash_key_file" "/etc/relmon/secrets/query-hash-key" }}
{{- end }}
{{- $_ := set $cfg "log_format" "json" }}
{{- $_ := set $cfg "drain_timeout_s" (int .Values.drainTimeoutSeconds) }}
{{- toYaml $cfg }}
{{- end }}
