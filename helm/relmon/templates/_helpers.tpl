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

{{/* A name with a suffix, still at most 63 characters: the full name is cut first. */}}
{{- define "relmon.suffixedName" -}}
{{- $base := include "relmon.fullname" .root | trunc (int (sub 63 (len .suffix))) | trimSuffix "-" }}
{{- printf "%s%s" $base .suffix }}
{{- end }}

{{- define "relmon.claimName" -}}
{{- .Values.persistence.existingClaim | default (include "relmon.suffixedName" (dict "root" . "suffix" "-state")) }}
{{- end }}

{{- define "relmon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "relmon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "relmon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels. The component is "monitor" for relmon's own objects; it is not part of
the selector (a Deployment's selector cannot change).
*/}}
{{- define "relmon.labels" -}}
helm.sh/chart: {{ include "relmon.chart" . }}
{{ include "relmon.selectorLabels" . }}
app.kubernetes.io/component: monitor
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

{{/*
The image: repository@digest when a digest is given, else repository:tag.
*/}}
{{- define "relmon.image" -}}
{{- if .Values.image.digest -}}
{{ printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end -}}
{{- end }}

{{/*
Predicates: each is "true" or "".
*/}}
{{- define "relmon.sidecarMode" -}}
{{- if eq .Values.mode "sidecar" }}true{{ end }}
{{- end }}

{{/* The review API and page exist (review.backend http). */}}
{{- define "relmon.reviewApi" -}}
{{- if eq .Values.review.backend "http" }}true{{ end }}
{{- end }}

{{/* Every relmon pod shares one calibration and review queue (PostgreSQL or Kafka). */}}
{{- define "relmon.sharedStore" -}}
{{- if or (eq .Values.review.backend "kafka") (eq .Values.store.backend "postgres") }}true{{ end }}
{{- end }}

{{/* The state lives in the pod, on a claim: a standalone SQLite install. */}}
{{- define "relmon.persistent" -}}
{{- if and .Values.persistence.enabled (eq .Values.mode "standalone") (not (include "relmon.sharedStore" .)) }}true{{ end }}
{{- end }}

{{/* The DSN Secret is mounted at /etc/relmon/store. */}}
{{- define "relmon.storeSecretMounted" -}}
{{- if and (eq .Values.store.backend "postgres") .Values.store.existingSecret }}true{{ end }}
{{- end }}

{{/* relmon receives OTLP/HTTP traces and logs (traffic.otlp.enabled). */}}
{{- define "relmon.otlp" -}}
{{- if .Values.traffic.otlp.enabled }}true{{ end }}
{{- end }}

{{/* A Service with the review port is rendered. */}}
{{- define "relmon.reviewService" -}}
{{- if and .Values.service.enabled (include "relmon.reviewApi" .) }}true{{ end }}
{{- end }}

{{/* The pods relmon runs in when it is a sidecar (the application's). */}}
{{- define "relmon.sidecarPodSelector" -}}
{{- toYaml .Values.sidecar.podSelector }}
{{- end }}

{{/*
Bind hosts, one per listener (relmon's metrics.host, review.host, traffic.host,
traffic.otlp.host).
*/}}
{{- define "relmon.metricsHost" -}}
{{- .Values.hosts.metrics | default "0.0.0.0" }}
{{- end }}

{{- define "relmon.reviewHost" -}}
{{- if .Values.hosts.review }}
{{- .Values.hosts.review }}
{{- else if or (not (include "relmon.sidecarMode" .)) (include "relmon.reviewService" .) }}
{{- "0.0.0.0" }}
{{- else }}
{{- "127.0.0.1" }}
{{- end }}
{{- end }}

{{- define "relmon.trafficHost" -}}
{{- if .Values.hosts.traffic }}
{{- .Values.hosts.traffic }}
{{- else if include "relmon.sidecarMode" . }}
{{- "127.0.0.1" }}
{{- else }}
{{- "0.0.0.0" }}
{{- end }}
{{- end }}

{{- define "relmon.otlpHost" -}}
{{- if .Values.hosts.otlp }}
{{- .Values.hosts.otlp }}
{{- else if include "relmon.sidecarMode" . }}
{{- "127.0.0.1" }}
{{- else }}
{{- "0.0.0.0" }}
{{- end }}
{{- end }}

{{- define "relmon.isLoopback" -}}
{{- $host := toString . }}
{{- if or (hasPrefix "127." $host) (eq $host "localhost") (eq $host "::1") }}true{{ end }}
{{- end }}

{{/*
Secrets. The chart's Secret holds only what the values give: nothing is generated at
render time, so the same values always render the same bytes.
*/}}
{{- define "relmon.secretData" -}}
{{- $data := dict }}
{{- if and .Values.secret.create (not .Values.secret.existingSecret) }}
{{- if and (include "relmon.reviewApi" .) .Values.secret.reviewToken }}
{{- $_ := set $data "review-token" (.Values.secret.reviewToken | b64enc) }}
{{- end }}
{{- if .Values.secret.queryHashKey }}
{{- $_ := set $data "query-hash-key" (.Values.secret.queryHashKey | b64enc) }}
{{- end }}
{{- if .Values.secret.kafkaSaslPassword }}
{{- $_ := set $data "kafka-sasl-password" (.Values.secret.kafkaSaslPassword | b64enc) }}
{{- end }}
{{- range $name, $key := .Values.secret.apiKeys }}
{{- $_ := set $data (printf "api-key-%s" $name) ($key | b64enc) }}
{{- end }}
{{- end }}
{{- if $data }}{{ toYaml $data }}{{ end }}
{{- end }}

{{/* The chart renders its own Secret. */}}
{{- define "relmon.createsSecret" -}}
{{- if include "relmon.secretData" . }}true{{ end }}
{{- end }}

{{- define "relmon.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- include "relmon.fullname" . }}
{{- end }}
{{- end }}

{{/* A Secret is mounted at /etc/relmon/secrets (yours or the chart's). */}}
{{- define "relmon.hasSecret" -}}
{{- if or .Values.secret.existingSecret (include "relmon.createsSecret" .) }}true{{ end }}
{{- end }}

{{/*
The review token's file, "" when there is none (Kafka backend, auth proxy, or reviewer
tokens only). Precedence: review.auth.existingSecret's tokenKey, then the key
review-token of secret.existingSecret or of the chart's Secret (secret.reviewToken),
then a token relmon's pod generates at its first start into the state volume.
*/}}
{{- define "relmon.reviewTokenFile" -}}
{{- $auth := .Values.review.auth }}
{{- if and (include "relmon.reviewApi" .) (eq $auth.mode "token") }}
{{- if $auth.existingSecret }}
{{- if $auth.tokenKey }}/etc/relmon/review-auth/token{{ end }}
{{- else if or .Values.secret.existingSecret (and .Values.secret.create .Values.secret.reviewToken) }}
{{- "/etc/relmon/secrets/review-token" }}
{{- else }}
{{- "/var/lib/relmon/review-token" }}
{{- end }}
{{- end }}
{{- end }}

{{/* relmon's pod creates the review token at its first start (an init container). */}}
{{- define "relmon.generatesReviewToken" -}}
{{- if eq (include "relmon.reviewTokenFile" .) "/var/lib/relmon/review-token" }}true{{ end }}
{{- end }}

{{/* The Secret of review.auth is mounted at /etc/relmon/review-auth. */}}
{{- define "relmon.reviewAuthMounted" -}}
{{- $auth := .Values.review.auth }}
{{- if and (include "relmon.reviewApi" .) (eq $auth.mode "token") $auth.existingSecret (or $auth.tokenKey $auth.tokensKey) }}true{{ end }}
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
Annotations that roll relmon's pods when its configuration or the chart's Secret
changes. The standalone Deployment carries them; an application chart adds them to its
own pod template with {{ include "relmon.sidecar.podAnnotations" .Subcharts.relmon }}.
*/}}
{{- define "relmon.checksums" -}}
checksum/relmon-config: {{ include "relmon.configFile" . | sha256sum }}
{{- with include "relmon.secretData" . }}
checksum/relmon-secret: {{ . | sha256sum }}
{{- end }}
{{- end }}
