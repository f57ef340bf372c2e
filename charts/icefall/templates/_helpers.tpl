{{/* Object names: <release>-icefall unless the release name already says icefall; at most 63 chars. */}}
{{- define "icefall.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "icefall.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Immutable labels used by selectors. */}}
{{- define "icefall.selectorLabels" -}}
app.kubernetes.io/name: {{ include "icefall.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "icefall.labels" -}}
{{ include "icefall.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: icefall
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "icefall.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "icefall.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The one image of the operator and of every pod it creates. */}}
{{- define "icefall.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's ports must not collide: health vs metrics always (one container), and on the host
network not with the range the table pods' metrics ports come from (they share the node's ports). */}}
{{- define "icefall.checkPorts" -}}
{{- $ports := dict "health.port" (int .Values.health.port) }}
{{- if .Values.metrics.enabled }}
{{- $_ := set $ports "metrics.port" (int .Values.metrics.port) }}
{{- if eq (int .Values.health.port) (int .Values.metrics.port) }}
{{- fail (printf "health.port and metrics.port are both %d: give them different ports" (int .Values.health.port)) }}
{{- end }}
{{- end }}
{{- if .Values.hostNetwork }}
{{- $first := int .Values.hostNetworkPorts.first }}
{{- $last := int .Values.hostNetworkPorts.last }}
{{- range $name, $port := $ports }}
{{- if and (ge $port $first) (le $port $last) }}
{{- fail (printf "%s %d is inside hostNetworkPorts (%d-%d), where table pods on the node's network get their metrics ports: with hostNetwork pick a port outside it" $name $port $first $last) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The ServiceAccount annotations `cloudIdentity` asks for (JSON; {} when none is set). */}}
{{- define "icefall.identityAnnotations" -}}
{{- $found := dict -}}
{{- with .Values.cloudIdentity.awsRoleArn }}{{ $_ := set $found "eks.amazonaws.com/role-arn" . }}{{ end -}}
{{- with .Values.cloudIdentity.gcpServiceAccount }}{{ $_ := set $found "iam.gke.io/gcp-service-account" . }}{{ end -}}
{{- with .Values.cloudIdentity.azureClientId }}{{ $_ := set $found "azure.workload.identity/client-id" . }}{{ end -}}
{{- toJson $found -}}
{{- end -}}

{{/* The pod labels `cloudIdentity` asks for (JSON): AKS injects its token only into labelled pods. */}}
{{- define "icefall.identityLabels" -}}
{{- if .Values.cloudIdentity.azureClientId }}{"azure.workload.identity/use":"true"}{{ else }}{}{{ end -}}
{{- end -}}

{{/* `pods` with `cloudIdentity` under `common` (explicit values win), as JSON for ICEFALL_POD_TEMPLATE. */}}
{{- define "icefall.podTemplates" -}}
{{- $pods := deepCopy (.Values.pods | default dict) -}}
{{- $common := deepCopy (get $pods "common" | default dict) -}}
{{- $annotations := include "icefall.identityAnnotations" . | fromJson -}}
{{- $labels := include "icefall.identityLabels" . | fromJson -}}
{{- if $annotations }}
{{- $_ := set $common "serviceAccountAnnotations" (merge (get $common "serviceAccountAnnotations" | default dict) $annotations) -}}
{{- end }}
{{- if $labels }}
{{- $_ := set $common "labels" (merge (get $common "labels" | default dict) $labels) -}}
{{- end }}
{{- if or $annotations $labels }}
{{- $_ := set $pods "common" $common -}}
{{- end }}
{{- toJson $pods -}}
{{- end -}}
