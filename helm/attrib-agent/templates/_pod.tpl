{{/*
The pieces of a vLLM pod that carries the agent, shared by deploy mode (the Deployment) and sidecar-only
mode (the pod-patch ConfigMap). Each takes a dict: ctx (the root context) and, where it matters, logDir
(where vLLM's log file lives in the pod) and logVolume (the volume holding it).
*/}}

{{/* The format of the lab (attrib_agent/lab/server.py LOG_FORMAT): vLLM's prefix, stamps with year and ms. */}}
{{- define "attrib-agent.logFormat" -}}
(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s.%(msecs)03d [%(fileinfo)s:%(lineno)d] %(message)s
{{- end -}}

{{/* vLLM's logging.config.dictConfig (VLLM_LOGGING_CONFIG_PATH), as JSON. Takes (dict "ctx" . "logDir" dir). */}}
{{- define "attrib-agent.vllmLoggingConfig" -}}
{{- $l := .ctx.Values.vllm.logging -}}
{{- $fmt := dict "()" "vllm.logging_utils.NewLineFormatter" "format" (include "attrib-agent.logFormat" .) "datefmt" "%Y-%m-%d %H:%M:%S" -}}
{{- $stdout := dict "class" "logging.StreamHandler" "formatter" "vllm_ms" "level" $l.level "stream" "ext://sys.stdout" -}}
{{- $file := dict "class" "logging.handlers.RotatingFileHandler" "formatter" "vllm_ms" "level" $l.level "filename" (printf "%s/vllm.log" .logDir) "maxBytes" (int64 $l.maxBytes) "backupCount" (int $l.backupCount) "encoding" "utf-8" -}}
{{- $loggers := dict "vllm" (dict "handlers" (list "stdout") "level" $l.level "propagate" false) -}}
{{- range $l.fileLoggers -}}
{{- $_ := set $loggers . (dict "handlers" (list "attrib_file") "propagate" true) -}}
{{- end -}}
{{- dict "version" 1 "disable_existing_loggers" false "formatters" (dict "vllm_ms" $fmt) "handlers" (dict "stdout" $stdout "attrib_file" $file) "loggers" $loggers | toPrettyJson -}}
{{- end -}}

{{/* The emptyDir holding vLLM's log: room for the live file and its backups, plus a quarter for long lines. */}}
{{- define "attrib-agent.logSizeLimit" -}}
{{- $l := .Values.vllm.logging -}}
{{- $bytes := mul (int64 $l.maxBytes) (add1 (int64 $l.backupCount)) -}}
{{- printf "%dMi" (add1 (div (mul $bytes 5) (mul 4 1048576))) -}}
{{- end -}}

{{/* The vLLM flags the agent needs (YAML list items). */}}
{{- define "attrib-agent.vllmArgs" -}}
- --enable-log-requests
- --enable-logging-iteration-details
{{- if .Values.vllm.tracing.enabled }}
- --otlp-traces-endpoint
- {{ printf "http://127.0.0.1:%d" (int .Values.agent.otlp.grpcPort) | quote }}
{{- end }}
{{- end -}}

{{/* Resource attributes for spans, per OpenTelemetry's semantic conventions (k8s.*, service.name). */}}
{{- define "attrib-agent.otelEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),k8s.container.name={{ .container }}"
{{- end -}}

{{/*
vLLM's environment for the agent. Takes (dict "configPath" file "container" vLLM's container name "ctx" root):
with ctx, exact mode's variables too (the plugin's socket; its install dir on PYTHONPATH).
*/}}
{{- define "attrib-agent.vllmEnv" -}}
- name: VLLM_LOGGING_CONFIG_PATH
  value: {{ .configPath | quote }}
{{- /* The agent reads the log's stamps as UTC. */}}
- name: TZ
  value: UTC
- name: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
  value: grpc
{{ include "attrib-agent.otelEnv" (dict "service" "vllm" "container" .container) }}
{{- with .ctx }}
{{- $e := .Values.exactMode }}
{{- if $e.enabled }}
- name: ATTRIB_PLUGIN_SOCKET
  value: {{ include "attrib-agent.pluginSocket" . | quote }}
{{- if eq $e.install "initContainer" }}
- name: PYTHONPATH
  value: {{ $e.pluginDir | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Exact mode: the unix datagram socket the agent listens on and vLLM's plugin sends to. */}}
{{- define "attrib-agent.pluginSocket" -}}
{{- printf "%s/plugin.sock" (trimSuffix "/" .Values.exactMode.socketDir) -}}
{{- end -}}

{{/*
Exact mode's init container: pip-installs the plugin (no dependencies: it needs only vLLM, which the image
has) into the emptyDir vLLM gets on its PYTHONPATH. YAML list items; empty unless exactMode installs it.
*/}}
{{- define "attrib-agent.pluginInstaller" -}}
{{- $e := .Values.exactMode -}}
{{- if and $e.enabled (eq $e.install "initContainer") -}}
{{- $image := printf "%s:%s" .Values.vllm.image.repository .Values.vllm.image.tag -}}
{{- with $e.installerImage.repository -}}
{{- $image = printf "%s:%s" . ($e.installerImage.tag | default "latest") -}}
{{- end -}}
- name: attrib-plugin-install
  image: {{ $image | quote }}
  imagePullPolicy: {{ $e.installerImage.pullPolicy | default "IfNotPresent" }}
  command:
    - python3
    - -m
    - pip
    - install
    - --no-cache-dir
    - --no-deps
    - --disable-pip-version-check
    - --target
    - {{ $e.pluginDir | quote }}
    {{- range $e.pipArgs }}
    - {{ . | quote }}
    {{- end }}
    - {{ $e.package | quote }}
  {{- with $e.installerResources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.vllm.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: attrib-plugin
      mountPath: {{ $e.pluginDir }}
{{- end -}}
{{- end -}}

{{/* The agent's flags. podVolumes false: the pod has none of the chart's volumes (no journal, no state then). */}}
{{- define "attrib-agent.agentArgs" -}}
{{- $a := .ctx.Values.agent -}}
{{- $podVolumes := ne (toString .podVolumes) "false" -}}
- run
- --vllm-url
- {{ printf "http://127.0.0.1:%d" (int .ctx.Values.vllm.port) | quote }}
- --log-file
- {{ printf "%s/vllm.log" .logDir | quote }}
- --otlp-grpc-port
- {{ int $a.otlp.grpcPort | quote }}
- --otlp-http-port
- {{ int $a.otlp.httpPort | quote }}
- --listen
- {{ printf "0.0.0.0:%d" (int $a.port) | quote }}
- {{ ternary "--nvml" "--no-nvml" (eq (toString $a.nvml.enabled) "true") }}
{{- with $a.otlp.forward }}
- --otlp-forward
- {{ . | quote }}
{{- end }}
{{- if and $a.journal.enabled $podVolumes }}
- --journal-dir
- /var/lib/attrib-agent
- --journal-max-bytes
- {{ $a.journal.maxBytes | quote }}
{{- end }}
{{- if and $a.state.enabled $podVolumes }}
- --state-dir
- /var/lib/attrib-agent-state
{{- end }}
{{- if and .ctx.Values.exactMode.enabled $podVolumes }}
- --plugin-socket
- {{ include "attrib-agent.pluginSocket" .ctx | quote }}
{{- end }}
{{- $budget := include "attrib-agent.vllmTokenBudget" .ctx -}}
{{- if and $budget (not (has "--token-budget" $a.extraArgs)) }}
- --token-budget
- {{ $budget | quote }}
{{- end }}
{{- range $a.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
vLLM's step budget when vllm.extraArgs sets it (`--max-num-batched-tokens N` or `=N`), else empty: the agent reads
it from vLLM's start-up line too, but a sidecar restarted while vLLM runs starts at its log's end and misses it.
*/}}
{{- define "attrib-agent.vllmTokenBudget" -}}
{{- $args := .Values.vllm.extraArgs | default list -}}
{{- $budget := "" -}}
{{- range $i, $x := $args -}}
{{- $s := toString $x -}}
{{- if hasPrefix "--max-num-batched-tokens=" $s -}}
{{- $budget = trimPrefix "--max-num-batched-tokens=" $s -}}
{{- else if and (eq $s "--max-num-batched-tokens") (lt (add1 $i) (len $args)) -}}
{{- $budget = toString (index $args (add1 $i)) -}}
{{- end -}}
{{- end -}}
{{- $budget -}}
{{- end -}}

{{/*
The agent container. Takes (dict "ctx" . "native" bool "logDir" dir "logVolume" name "logMount" path
"podVolumes" bool): podVolumes false leaves out the mounts of the chart's own volumes (tmp, journal, state).
*/}}
{{- define "attrib-agent.agentContainer" -}}
{{- $ := .ctx -}}
{{- $a := $.Values.agent -}}
{{- $podVolumes := ne (toString .podVolumes) "false" -}}
- name: attrib-agent
  image: {{ include "attrib-agent.agentImage" $ | quote }}
  imagePullPolicy: {{ $a.image.pullPolicy }}
  {{- if .native }}
  restartPolicy: Always
  {{- end }}
  command:
    {{- toYaml $a.command | nindent 4 }}
  args:
    {{- include "attrib-agent.agentArgs" . | nindent 4 }}
  env:
    {{- include "attrib-agent.otelEnv" (dict "service" "attrib-agent" "container" "attrib-agent") | nindent 4 }}
    {{- if include "attrib-agent.hasToken" $ }}
    - name: ATTRIB_API_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ include "attrib-agent.tokenSecretName" $ }}
          key: {{ $a.apiToken.key }}
    {{- end }}
    {{- if and $a.nvml.enabled $a.nvml.visibleDevices }}
    - name: NVIDIA_VISIBLE_DEVICES
      value: {{ $a.nvml.visibleDevices | quote }}
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- with $a.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: attrib-http
      containerPort: {{ int $a.port }}
      protocol: TCP
  {{- with $a.startupProbe }}
  startupProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $a.livenessProbe }}
  livenessProbe:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml $a.resources | nindent 4 }}
  securityContext:
    {{- toYaml $a.securityContext | nindent 4 }}
  volumeMounts:
    - name: {{ .logVolume }}
      mountPath: {{ .logMount }}
      readOnly: true
    {{- if $podVolumes }}
    - name: attrib-agent-tmp
      mountPath: /tmp
    {{- end }}
    {{- if and $a.journal.enabled $podVolumes }}
    - name: attrib-agent-journal
      mountPath: /var/lib/attrib-agent
    {{- end }}
    {{- if and $a.state.enabled $podVolumes }}
    - name: attrib-agent-state
      mountPath: /var/lib/attrib-agent-state
    {{- end }}
    {{- if and $.Values.exactMode.enabled $podVolumes }}
    - name: attrib-plugin-socket
      mountPath: {{ $.Values.exactMode.socketDir }}
    {{- end }}
{{- end -}}

{{/* Volumes the agent adds to the pod (YAML list items). */}}
{{- define "attrib-agent.agentVolumes" -}}
- name: vllm-logs
  emptyDir:
    sizeLimit: {{ include "attrib-agent.logSizeLimit" . }}
- name: vllm-logging-config
  configMap:
    name: {{ include "attrib-agent.child" (list . "vllm-logging") }}
- name: attrib-agent-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.agent.journal.enabled }}
- name: attrib-agent-journal
  {{- if .Values.agent.journal.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.agent.journal.existingClaim }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.agent.journal.sizeLimit }}
  {{- end }}
{{- end }}
{{- if .Values.agent.state.enabled }}
- name: attrib-agent-state
  {{- if .Values.agent.state.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.agent.state.existingClaim }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ .Values.agent.state.sizeLimit }}
  {{- end }}
{{- end }}
{{- if .Values.exactMode.enabled }}
- name: attrib-plugin-socket
  emptyDir:
    sizeLimit: 1Mi
{{- if eq .Values.exactMode.install "initContainer" }}
- name: attrib-plugin
  emptyDir:
    sizeLimit: 64Mi
{{- end }}
{{- end }}
{{- end -}}

{{/* vLLM's mounts for the agent (YAML list items). */}}
{{- define "attrib-agent.vllmVolumeMounts" -}}
- name: vllm-logs
  mountPath: {{ .Values.vllm.logging.dir }}
- name: vllm-logging-config
  mountPath: /etc/attrib-agent
  readOnly: true
{{- if .Values.exactMode.enabled }}
- name: attrib-plugin-socket
  mountPath: {{ .Values.exactMode.socketDir }}
{{- if eq .Values.exactMode.install "initContainer" }}
- name: attrib-plugin
  mountPath: {{ .Values.exactMode.pluginDir }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}
