{{/*
The readiness probe's path. /readyz is 503 while monitoring is stopped (an open or
half-open circuit breaker, a broker gone); /readyz/traffic only while relmon starts or
stops. /readyz is used only where relmon pulls its traffic from Kafka (standalone,
traffic.mode "off", no OTLP receiver): readiness does not stop a consumer, so the next
event still comes, its first call is the circuit breaker's trial and monitoring recovers
by itself. Everything fed through a Service or a pod uses /readyz/traffic:
- mirror (the default) and OTLP: an unready pod is removed from the Service, mirrored
  copies (or exported spans) stop arriving, no item means no trial call, so the circuit
  never closes and the pod never becomes ready again (and reviewers lose the review API
  on the same Service);
- proxy: relmon is in the live path, the application's traffic would stop too;
- sidecar: its readiness is its whole pod's, the application's (and it has a readiness
  probe at all only as a proxy).
*/}}
{{- define "relmon.readinessPath" -}}
{{- if .Values.probes.readinessPath -}}
{{ .Values.probes.readinessPath }}
{{- else if and (eq .Values.mode "standalone") (eq .Values.traffic.mode "off") (not (include "relmon.otlp" .)) -}}
/readyz
{{- else -}}
/readyz/traffic
{{- end -}}
{{- end -}}

{{/*
The relmon container, from a dict: root (the chart's context) and native (true: a native
sidecar, restartPolicy Always in initContainers).

Probes. Standalone: startup (/healthz), liveness (/healthz), readiness. Sidecar: the
readiness probe only as a proxy (the application's requests pass through relmon, so the
pod must not be ready before it); with mirrored or Kafka traffic relmon's readiness must
not decide the application pod's. A native sidecar's startup probe makes the
application's containers wait for it, so it has one only as a proxy too; without it,
liveness waits probes.startupTimeoutSeconds before its first check.
*/}}
{{- define "relmon.container" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $sidecar := include "relmon.sidecarMode" $root }}
{{- $inPath := eq $v.traffic.mode "proxy" }}
{{- $startup := or (not .native) $inPath }}
{{- $startupPath := ternary "/readyz/traffic" "/healthz" (not (empty $sidecar)) -}}
- name: relmon
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  image: {{ include "relmon.image" $root | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args: ["run", "--config", "/etc/relmon/config/relmon.yaml"]
  ports:
    - name: relmon-metrics
      containerPort: {{ $v.ports.metrics }}
      protocol: TCP
    {{- if include "relmon.reviewApi" $root }}
    - name: relmon-review
      containerPort: {{ $v.ports.review }}
      protocol: TCP
    {{- end }}
    {{- if ne $v.traffic.mode "off" }}
    - name: relmon-traffic
      containerPort: {{ $v.ports.traffic }}
      protocol: TCP
    {{- end }}
    {{- if include "relmon.otlp" $root }}
    - name: relmon-otlp
      containerPort: {{ $v.ports.otlp }}
      protocol: TCP
    {{- end }}
  {{- with $v.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $startup }}
  startupProbe:
    httpGet:
      path: {{ $startupPath }}
      port: relmon-metrics
    periodSeconds: 2
    failureThreshold: {{ div (int $v.probes.startupTimeoutSeconds) 2 }}
  {{- end }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: relmon-metrics
    {{- if not $startup }}
    initialDelaySeconds: {{ $v.probes.startupTimeoutSeconds }}
    {{- end }}
    periodSeconds: {{ $v.probes.livenessPeriodSeconds }}
    timeoutSeconds: 5
    failureThreshold: 3
  {{- if or (not $sidecar) $inPath }}
  readinessProbe:
    httpGet:
      path: {{ include "relmon.readinessPath" $root }}
      port: relmon-metrics
    periodSeconds: {{ $v.probes.readinessPeriodSeconds }}
    timeoutSeconds: 5
    failureThreshold: 3
  {{- end }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    {{- toYaml $v.securityContext | nindent 4 }}
  volumeMounts:
    - name: relmon-config
      mountPath: /etc/relmon/config
      readOnly: true
    {{- if include "relmon.hasSecret" $root }}
    - name: relmon-secrets
      mountPath: /etc/relmon/secrets
      readOnly: true
    {{- end }}
    {{- if include "relmon.reviewAuthMounted" $root }}
    - name: relmon-review-auth
      mountPath: /etc/relmon/review-auth
      readOnly: true
    {{- end }}
    {{- if include "relmon.storeSecretMounted" $root }}
    - name: relmon-store
      mountPath: /etc/relmon/store
      readOnly: true
    {{- end }}
    {{- if include "relmon.kafkaTlsMounted" $root }}
    - name: relmon-kafka-tls
      mountPath: /etc/relmon/kafka-tls
      readOnly: true
    {{- end }}
    - name: relmon-state
      mountPath: /var/lib/relmon
    - name: relmon-tmp
      mountPath: /tmp
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The init container that creates the review token in the state volume at the first start
of a standalone SQLite pod given no token (the token then lives on the claim, never in a
manifest: the render stays reproducible).
*/}}
{{- define "relmon.reviewTokenInitContainer" -}}
- name: relmon-review-token
  image: {{ include "relmon.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import os, secrets
      path = "/var/lib/relmon/review-token"
      if not os.path.exists(path):
          fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
          os.write(fd, secrets.token_hex(24).encode("ascii"))
          os.fsync(fd)
          os.close(fd)
          os.replace(path + ".new", path)
          print("relmon: created the review token", path)
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 64Mi
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: relmon-state
      mountPath: /var/lib/relmon
{{- end }}

{{/*
Templates for an application chart that has relmon as a dependency (mode: sidecar):

  spec:
    {{- with include "relmon.sidecar.initContainers" .Subcharts.relmon }}
    initContainers:
      {{- . | nindent 8 }}
    {{- end }}
    containers:
      - name: app
        ...
      {{- include "relmon.sidecar.containers" .Subcharts.relmon | nindent 8 }}
    volumes:
      {{- include "relmon.sidecar.volumes" .Subcharts.relmon | nindent 8 }}

and in the pod template's annotations (so that relmon's config and Secret roll the pods):
  {{- include "relmon.sidecar.podAnnotations" .Subcharts.relmon | nindent 8 }}

"relmon.sidecar.initContainers" renders relmon as a native sidecar (sidecar.native, the
default; Kubernetes >= 1.29), "relmon.sidecar.containers" as a plain container
(sidecar.native: false): each renders nothing in the other case.
*/}}
{{- define "relmon.sidecar" -}}
{{- include "relmon.container" (dict "root" . "native" false) }}
{{- end }}

{{- define "relmon.sidecar.initContainers" -}}
{{- if .Values.sidecar.native }}
{{- include "relmon.container" (dict "root" . "native" true) }}
{{- end }}
{{- end }}

{{- define "relmon.sidecar.containers" -}}
{{- if not .Values.sidecar.native }}
{{- include "relmon.container" (dict "root" . "native" false) }}
{{- end }}
{{- end }}

{{- define "relmon.sidecar.podAnnotations" -}}
{{- include "relmon.checksums" . }}
{{- end }}

{{/*
relmon's volumes. Secrets are readable by relmon's user without an fsGroup in sidecar
mode (0444: only relmon's container mounts them); standalone, the pod's fsGroup gives
relmon's group read access (0440).
*/}}
{{- define "relmon.sidecar.volumes" -}}
{{- $mode := ternary "0444" "0440" (not (empty (include "relmon.sidecarMode" .))) -}}
- name: relmon-config
  configMap:
    name: {{ include "relmon.fullname" . }}
{{- if include "relmon.hasSecret" . }}
- name: relmon-secrets
  secret:
    secretName: {{ include "relmon.secretName" . }}
    defaultMode: {{ $mode }}
{{- end }}
{{- if include "relmon.reviewAuthMounted" . }}
{{- $auth := .Values.review.auth }}
- name: relmon-review-auth
  secret:
    secretName: {{ $auth.existingSecret }}
    defaultMode: {{ $mode }}
    items:
      {{- if $auth.tokenKey }}
      - key: {{ $auth.tokenKey }}
        path: token
      {{- end }}
      {{- if $auth.tokensKey }}
      - key: {{ $auth.tokensKey }}
        path: tokens
      {{- end }}
{{- end }}
{{- if include "relmon.storeSecretMounted" . }}
- name: relmon-store
  secret:
    secretName: {{ .Values.store.existingSecret }}
    defaultMode: {{ $mode }}
    items:
      - key: {{ .Values.store.dsnKey }}
        path: dsn
{{- end }}
{{- if include "relmon.kafkaTlsMounted" . }}
- name: relmon-kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: {{ $mode }}
{{- end }}
- name: relmon-state
{{- if include "relmon.persistent" . }}
  persistentVolumeClaim:
    claimName: {{ include "relmon.claimName" . }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: relmon-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 64Mi
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}
