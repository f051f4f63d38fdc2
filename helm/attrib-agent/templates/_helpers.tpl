{{/* Names and labels (Helm's conventions: app.kubernetes.io/*, names cut to 63 characters). */}}
{{- define "attrib-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "attrib-agent.fullname" -}}
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
{{- end -}}

{{/* A name derived from the fullname: (list . "suffix"). */}}
{{- define "attrib-agent.child" -}}
{{- $full := include "attrib-agent.fullname" (index . 0) -}}
{{- printf "%s-%s" ($full | trunc (int (sub 62 (len (index . 1)))) | trimSuffix "-") (index . 1) -}}
{{- end -}}

{{- define "attrib-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "attrib-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attrib-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "attrib-agent.labels" -}}
helm.sh/chart: {{ include "attrib-agent.chart" . }}
{{ include "attrib-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: attrib-agent
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels that select the vLLM pods: the chart's own in deploy mode, the user's in sidecar-only mode. */}}
{{- define "attrib-agent.podSelector" -}}
{{- if eq .Values.mode "deploy" -}}
{{ include "attrib-agent.selectorLabels" . }}
{{- else -}}
{{ toYaml .Values.sidecar.podSelector }}
{{- end -}}
{{- end -}}

{{- define "attrib-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "attrib-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "attrib-agent.agentImage" -}}
{{- printf "%s:%s" .Values.agent.image.repository (default .Chart.AppVersion .Values.agent.image.tag) -}}
{{- end -}}

{{/* "true" when the agent runs as a native sidecar (init container, restartPolicy Always; Kubernetes >= 1.29). */}}
{{- define "attrib-agent.nativeSidecar" -}}
{{- $want := toString .Values.agent.nativeSidecar -}}
{{- if eq $want "auto" -}}
{{- if semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- else if eq $want "true" -}}true
{{- end -}}
{{- end -}}

{{- define "attrib-agent.tokenSecretName" -}}
{{- default (include "attrib-agent.child" (list . "api-token")) .Values.agent.apiToken.existingSecret -}}
{{- end -}}

{{- define "attrib-agent.hasToken" -}}
{{- if or .Values.agent.apiToken.existingSecret .Values.agent.apiToken.value -}}true{{- end -}}
{{- end -}}

{{/* Checks that give a clear message instead of a broken manifest. Included by every mode's objects. */}}
{{- define "attrib-agent.validate" -}}
{{- if not (has .Values.mode (list "deploy" "sidecar-only")) -}}
{{- fail (printf "mode must be deploy or sidecar-only, got %q" (toString .Values.mode)) -}}
{{- end -}}
{{- if eq .Values.mode "deploy" -}}
{{- $_ := required "vllm.model is required in deploy mode: the model vLLM serves (e.g. --set vllm.model=Qwen/Qwen2.5-1.5B-Instruct)" .Values.vllm.model -}}
{{- else -}}
{{- if not .Values.sidecar.podSelector -}}
{{- fail "sidecar.podSelector is required in sidecar-only mode: the labels of the existing vLLM pods" -}}
{{- end -}}
{{- $_ := required "sidecar.deploymentName is required in sidecar-only mode: the vLLM Deployment the patch targets" .Values.sidecar.deploymentName -}}
{{- if and .Values.sidecar.vllmChart.releaseName (not .Values.sidecar.vllmChart.command) -}}
{{- fail "sidecar.vllmChart.command is required with sidecar.vllmChart.releaseName: that chart's image.command (vllm serve ...)" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.agent.apiToken.existingSecret .Values.agent.apiToken.value -}}
{{- fail "agent.apiToken: set existingSecret or value, not both" -}}
{{- end -}}
{{- if lt (int .Values.vllm.logging.backupCount) 1 -}}
{{- fail "vllm.logging.backupCount must be at least 1: without an old file to finish, rotation would lose lines" -}}
{{- end -}}
{{- end -}}
