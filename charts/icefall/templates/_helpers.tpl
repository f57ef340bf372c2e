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

{{/* The one image of the operator and of every pod it creates: pinned by `image.digest` when set (it wins
over the tag), else tagged `image.tag` or the chart's appVersion. */}}
{{- define "icefall.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches, as JSON: {"clusterWide": bool, "namespaces": [...]}: every one
(rbac.clusterWide), the listed ones (watchNamespaces), or the release namespace alone. */}}
{{- define "icefall.watched" -}}
{{- if and .Values.rbac.clusterWide .Values.watchNamespaces }}
{{- fail "rbac.clusterWide watches every namespace and watchNamespaces lists some: set one of them" }}
{{- end }}
{{- if .Values.rbac.clusterWide }}
{{- toJson (dict "clusterWide" true "namespaces" list) }}
{{- else }}
{{- toJson (dict "clusterWide" false "namespaces" (.Values.watchNamespaces | default (list .Release.Namespace) | uniq)) }}
{{- end }}
{{- end }}

{{/* matchResources of an admission policy binding: the watched namespaces (nothing: every namespace). */}}
{{- define "icefall.watchedMatchResources" -}}
{{- $watched := include "icefall.watched" . | fromJson }}
{{- if not $watched.clusterWide }}
matchResources:
  namespaceSelector:
    {{- if eq (len $watched.namespaces) 1 }}
    matchLabels:
      kubernetes.io/metadata.name: {{ first $watched.namespaces }}
    {{- else }}
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson $watched.namespaces }}
    {{- end }}
{{- end }}
{{- end }}

{{/* Whether to render the PodDisruptionBudget: podDisruptionBudget.enabled true, or auto with replicas > 1. */}}
{{- define "icefall.pdbWanted" -}}
{{- $enabled := toString .Values.podDisruptionBudget.enabled }}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (gt (int .Values.replicas) 1)) }}true{{ end }}
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

{{/* CEL: whether the string `value` (a CEL expression) matches one of `patterns` (a CEL list expression of
names and `prefix*`): `include "icefall.celMatch" (list "variables.annotations" "k")`. Mirrors
icefall.api.pod_policy.first_match. */}}
{{- define "icefall.celMatch" -}}
{{- $patterns := index . 0 -}}
{{- $value := index . 1 -}}
{{ $patterns }}.exists(a, a == {{ $value }} || (a.endsWith('*') && {{ $value }}.startsWith(a.substring(0, size(a) - 1))))
{{- end -}}

{{/* What the chart's own `pods` (common and executor parts) give executor pods, as JSON {"hostNetwork": bool,
"volumeTypes": [...], "secrets": [...]}: the executors' admission policy allows those besides podPolicy. */}}
{{- define "icefall.chartExecutorPods" -}}
{{- $hostNetwork := false -}}
{{- $types := list -}}
{{- $secrets := list -}}
{{- range $part := list "common" "executor" -}}
{{- $template := get ($.Values.pods | default dict) $part | default dict -}}
{{- if $template.hostNetwork }}{{ $hostNetwork = true }}{{ end -}}
{{- range $volume := $template.volumes | default list -}}
{{- range $key, $_ := $volume }}{{ if ne $key "name" }}{{ $types = append $types $key }}{{ end }}{{ end -}}
{{- with $volume.secret }}{{ with .secretName }}{{ $secrets = append $secrets . }}{{ end }}{{ end -}}
{{- with $volume.projected }}{{ range .sources | default list }}{{ with .secret }}{{ with .name }}{{ $secrets = append $secrets . }}{{ end }}{{ end }}{{ end }}{{ end -}}
{{- with $volume.csi }}{{ with .nodePublishSecretRef }}{{ with .name }}{{ $secrets = append $secrets . }}{{ end }}{{ end }}{{ end -}}
{{- end -}}
{{- range $env := $template.env | default list -}}
{{- with $env.valueFrom }}{{ with .secretKeyRef }}{{ $secrets = append $secrets .name }}{{ end }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "hostNetwork" $hostNetwork "volumeTypes" (uniq $types) "secrets" (uniq $secrets)) -}}
{{- end -}}

{{/* CEL: the Secrets the StreamingTable `.` (a CEL expression: object, params) references outside spec.pods,
as a list of names: spec.source.security's and spec.format.registry's secret fields and
spec.table.catalog.secretProperties (icefall.plan.env.secret_env_vars, secretKeyRef references only). */}}
{{- define "icefall.celReferencedSecrets" -}}
{{- $root := . -}}
{{- $fields := list -}}
{{- range $field := list "username" "password" "caCert" "clientCert" "clientKey" -}}
{{- $fields = append $fields (printf "?%s.spec.source.?security.?%s.?secretKeyRef.?name" $root $field) -}}
{{- end -}}
{{- range $field := list "username" "password" -}}
{{- $fields = append $fields (printf "?%s.spec.format.?registry.?%s.?secretKeyRef.?name" $root $field) -}}
{{- end -}}
{{- $catalog := printf "%s.spec.table.catalog.secretProperties" $root -}}
[{{ join ", " $fields }}] + {{ $root }}.spec.table.?catalog.?secretProperties.orValue({}).filter(k, has({{ $catalog }}[k].secretKeyRef)).map(k, {{ $catalog }}[k].secretKeyRef.name)
{{- end -}}
