{{/*
Rules across keys. They live here rather than in values.schema.json (which checks each
key's type and values) because a template's message can say what to set.

One monitor per deployment: SQLite keeps one pod's calibration and review queue and has
a single writer, so more than one relmon pod (standalone replicaCount > 1 or KEDA, or a
sidecar next to an application with several replicas) needs a shared store:
store.backend postgres, or review.backend kafka.
*/}}
{{- define "relmon.validate" -}}
{{- $shared := include "relmon.sharedStore" . }}
{{- $sidecar := include "relmon.sidecarMode" . }}
{{- $shareHow := "set store.backend: postgres with store.existingSecret (the DSN), or review.backend: kafka with kafka.enabled" }}
{{- if and (not $sidecar) (not $shared) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount %d needs a shared store: %s (SQLite keeps one pod's state and has a single writer)" (int .Values.replicaCount) $shareHow) }}
{{- end }}
{{- if and (not $sidecar) (not $shared) .Values.keda.enabled }}
{{- fail (printf "keda.enabled scales replicas and needs a shared store: %s" $shareHow) }}
{{- end }}
{{- $oneApp := and (not (kindIs "invalid" .Values.sidecar.appReplicas)) (eq (int .Values.sidecar.appReplicas) 1) }}
{{- if and $sidecar (not $shared) (not $oneApp) }}
{{- fail (printf "mode: sidecar runs one relmon in each of your application's pods, and SQLite would make each of them a monitor of its own: %s; or, if your application runs exactly one replica, set sidecar.appReplicas: 1" $shareHow) }}
{{- end }}
{{- if and .Values.keda.enabled (not .Values.kafka.enabled) }}
{{- fail "keda.enabled scales on Kafka consumer lag and needs kafka.enabled: true" }}
{{- end }}
{{- if and (eq .Values.review.backend "kafka") (not .Values.kafka.enabled) }}
{{- fail "review.backend: kafka needs kafka.enabled: true" }}
{{- end }}
{{- if eq .Values.store.backend "postgres" }}
{{- if eq .Values.review.backend "kafka" }}
{{- fail "store.backend: postgres holds the review queue of review.backend: http; with review.backend: kafka the Kafka topics are the store (set store.backend: sqlite)" }}
{{- end }}
{{- $envDsn := false }}
{{- range .Values.extraEnv }}
{{- if eq .name "RELMON_STORE__DSN" }}{{ $envDsn = true }}{{ end }}
{{- end }}
{{- if and (not .Values.store.existingSecret) (not $envDsn) }}
{{- fail "store.backend: postgres needs the DSN: set store.existingSecret (a Secret holding postgresql://user:password@host:5432/db under store.dsnKey), or RELMON_STORE__DSN in extraEnv from a secretKeyRef" }}
{{- end }}
{{- if and .Values.store.existingSecret $envDsn }}
{{- fail "the DSN is given twice: store.existingSecret and RELMON_STORE__DSN in extraEnv; keep one" }}
{{- end }}
{{- if and .Values.store.existingSecret (not .Values.store.dsnKey) }}
{{- fail "store.existingSecret needs store.dsnKey, the Secret's key holding the DSN" }}
{{- end }}
{{- else if .Values.store.existingSecret }}
{{- fail "store.existingSecret is set but store.backend is not postgres" }}
{{- end }}
{{- if and (eq .Values.traffic.mode "proxy") (not .Values.traffic.upstreamUrl) (not .Values.traffic.routes) }}
{{- fail "traffic.mode: proxy needs traffic.upstreamUrl or traffic.routes" }}
{{- end }}
{{- if and .Values.traffic.routes (ne .Values.traffic.mode "proxy") }}
{{- fail "traffic.routes are the proxy's upstreams: set traffic.mode: proxy" }}
{{- end }}
{{- if and (include "relmon.otlp" .) (has (int .Values.ports.otlp) (list (int .Values.ports.metrics) (int .Values.ports.review) (int .Values.ports.traffic))) }}
{{- fail (printf "ports.otlp %d is another listener's port: give the OTLP receiver a port of its own" (int .Values.ports.otlp)) }}
{{- end }}
{{- include "relmon.validateReviewAuth" . }}
{{- include "relmon.validateKafka" . }}
{{- if and (eq .Values.mode "standalone") (eq .Values.traffic.mode "off") (not .Values.kafka.enabled) (not (include "relmon.otlp" .)) }}
{{- fail "standalone relmon needs a traffic source: traffic.mode mirror/proxy, traffic.otlp.enabled or kafka.enabled" }}
{{- end }}
{{- if and $sidecar .Values.service.enabled (include "relmon.reviewApi" .) (empty .Values.sidecar.podSelector) }}
{{- fail "the review Service in sidecar mode selects your application's pods: set sidecar.podSelector to their labels (e.g. {app.kubernetes.io/name: my-app}), or service.enabled: false" }}
{{- end }}
{{- if and $sidecar .Values.sidecar.native (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "sidecar.native needs Kubernetes 1.29 or later (native sidecars: an init container with restartPolicy Always), and this cluster is %s: set sidecar.native: false (relmon then runs as a plain container)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if and $sidecar .Values.metrics.serviceMonitor.enabled }}
{{- fail "metrics.serviceMonitor in sidecar mode finds no metrics Service: use metrics.podMonitor.enabled instead" }}
{{- end }}
{{- if and .Values.review.ingress.enabled (not (include "relmon.reviewService" .)) }}
{{- fail "review.ingress.enabled needs the review Service: service.enabled: true with review.backend: http" }}
{{- end }}
{{- if and (include "relmon.reviewService" .) (include "relmon.isLoopback" (include "relmon.reviewHost" .)) }}
{{- fail (printf "the review Service cannot reach a review API bound to %s: set hosts.review: 0.0.0.0 (or \"\"), or service.enabled: false" (include "relmon.reviewHost" .)) }}
{{- end }}
{{- $pm := .Values.metrics.podMonitor }}
{{- if $pm.enabled }}
{{- $host := include "relmon.metricsHost" . }}
{{- if include "relmon.isLoopback" $host }}
{{- fail (printf "metrics.podMonitor scrapes relmon's metrics port from Prometheus, but hosts.metrics %s binds it to the loopback address only: set hosts.metrics: 0.0.0.0 (or \"\")" $host) }}
{{- end }}
{{- if and $sidecar (empty $pm.podSelector) (empty .Values.sidecar.podSelector) }}
{{- fail "metrics.podMonitor in sidecar mode needs the labels of your application's pods, which carry the relmon container: set sidecar.podSelector (or metrics.podMonitor.podSelector)" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.service.enabled }}
{{- fail "enable metrics.serviceMonitor or metrics.podMonitor, not both: every relmon pod would be scraped twice as job relmon and sums over instances would count it twice" }}
{{- end }}
{{- end }}
{{- if and (not $sidecar) .Values.service.enabled }}
{{- $reached := dict "metrics" (include "relmon.metricsHost" .) }}
{{- if include "relmon.reviewApi" . }}{{ $_ := set $reached "review" (include "relmon.reviewHost" .) }}{{ end }}
{{- if ne .Values.traffic.mode "off" }}{{ $_ := set $reached "traffic" (include "relmon.trafficHost" .) }}{{ end }}
{{- if include "relmon.otlp" . }}{{ $_ := set $reached "otlp" (include "relmon.otlpHost" .) }}{{ end }}
{{- range $listener, $host := $reached }}
{{- if include "relmon.isLoopback" $host }}
{{- fail (printf "the Service cannot reach relmon's %s port bound to %s: set hosts.%s: 0.0.0.0 (or \"\"), or service.enabled: false" $listener $host $listener) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Review authentication: one token for all pods, and no token given twice.
*/}}
{{- define "relmon.validateReviewAuth" -}}
{{- $auth := .Values.review.auth }}
{{- if and (include "relmon.reviewApi" .) (eq $auth.mode "token") }}
{{- if and $auth.existingSecret (not $auth.tokenKey) (not $auth.tokensKey) }}
{{- fail "review.auth.existingSecret needs review.auth.tokenKey (the shared token) or review.auth.tokensKey (name:token lines), or both" }}
{{- end }}
{{- if and $auth.existingSecret $auth.tokenKey .Values.secret.reviewToken }}
{{- fail "the review token is given twice: secret.reviewToken and review.auth.existingSecret (tokenKey); keep one" }}
{{- end }}
{{- if and (include "relmon.generatesReviewToken" .) (or (include "relmon.sidecarMode" .) (include "relmon.sharedStore" .)) }}
{{- fail "the review API needs one token for every relmon pod: set secret.reviewToken, secret.existingSecret (key review-token) or review.auth.existingSecret, or review.auth.mode: proxy (a token is generated in the pod only for one standalone SQLite pod)" }}
{{- end }}
{{- end }}
{{- if and (ne $auth.mode "proxy") (or $auth.proxyHeaders $auth.trustedProxies) }}
{{- fail "review.auth.proxyHeaders and trustedProxies are for review.auth.mode: proxy" }}
{{- end }}
{{- if and (include "relmon.reviewApi" .) (not .Values.secret.create) (not .Values.secret.existingSecret) .Values.secret.reviewToken }}
{{- fail "secret.reviewToken is set but secret.create is false: set secret.create: true, or put the token in secret.existingSecret" }}
{{- end }}
{{- end }}

{{/*
Kafka security: complete and consistent.
*/}}
{{- define "relmon.validateKafka" -}}
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
{{- end }}
