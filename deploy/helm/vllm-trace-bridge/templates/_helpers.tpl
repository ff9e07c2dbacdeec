{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "vllm-trace-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "vllm-trace-bridge.fullname" -}}
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

{{/* Namespace of every object: namespaceOverride, else the release's. */}}
{{- define "vllm-trace-bridge.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of the ConfigMap holding config.yaml: the user's, or the one the chart renders. */}}
{{- define "vllm-trace-bridge.configMapName" -}}
{{- default (include "vllm-trace-bridge.fullname" .) .Values.existingConfigMap -}}
{{- end -}}

{{/* The node labels that select GPU nodes: gpuNodeLabel alone when set, else gpuNodeLabels. */}}
{{- define "vllm-trace-bridge.gpuLabels" -}}
{{- if .Values.gpuNodeLabel -}}
{{- list .Values.gpuNodeLabel | toJson -}}
{{- else -}}
{{- .Values.gpuNodeLabels | default list | toJson -}}
{{- end -}}
{{- end -}}

{{/* The pods' affinity: `affinity` when set, else a node with any of the GPU labels ("key=value"
     or just "key"; node selector terms are ORed), else none. */}}
{{- define "vllm-trace-bridge.affinity" -}}
{{- $labels := include "vllm-trace-bridge.gpuLabels" . | fromJsonArray -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else if $labels -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- range $labels }}
      {{- $kv := splitn "=" 2 . }}
      - matchExpressions:
          - key: {{ $kv._0 }}
            {{- if contains "=" . }}
            operator: In
            values: [{{ $kv._1 | quote }}]
            {{- else }}
            operator: Exists
            {{- end }}
      {{- end }}
{{- end -}}
{{- end -}}

{{- define "vllm-trace-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-trace-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vllm-trace-bridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "vllm-trace-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "vllm-trace-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "vllm-trace-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "vllm-trace-bridge.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding OTEL_EXPORTER_OTLP_HEADERS, or "" when there is none. */}}
{{- define "vllm-trace-bridge.headersSecret" -}}
{{- if .Values.otlp.existingSecret.name -}}
{{- .Values.otlp.existingSecret.name -}}
{{- else if .Values.otlp.headers -}}
{{- printf "%s-otlp" (include "vllm-trace-bridge.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The agent's config file: the `config` values plus the keys other values decide. */}}
{{- define "vllm-trace-bridge.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg "state_dir" .Values.stateDir.mountPath -}}
{{- with .Values.metrics.host -}}
{{- $_ := set $cfg "listen" (printf (ternary "[%s]:%d" "%s:%d" (contains ":" .)) (trimAll "[]" .) (int $.Values.metrics.port)) -}}
{{- end -}}
{{- if .Values.rules -}}
{{- if .Values.config.rules -}}
{{- fail "rules and config.rules are both set: give the rules as `rules` (the chart mounts them) or mount a file yourself and name it in config.rules, not both" -}}
{{- end -}}
{{- $_ := set $cfg "rules" "/etc/vllm-trace-bridge/rules.yaml" -}}
{{- end -}}
{{- $text := toYaml $cfg -}}
{{- if not $text -}}
{{- fail "config: a value cannot be written as YAML (Helm renders it as nothing); remove control characters such as DEL (\\x7f) or C1 codes from the config values" -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/* The `rules` values as the rule file the agent reads (its ConfigMap key rules.yaml). JSON,
     which YAML readers take as it is: every string quoted and escaped, so a pattern comes back
     exactly as given (toYaml leaves `=` or `<<` bare, and renders nothing for some characters). */}}
{{- define "vllm-trace-bridge.rules" -}}
{{- if and .Values.rules .Values.existingConfigMap -}}
{{- fail "rules cannot go in existingConfigMap, which the chart does not write: put them in that ConfigMap under rules.yaml and set config.rules: /etc/vllm-trace-bridge/rules.yaml there" -}}
{{- end -}}
{{- with .Values.rules -}}
{{- $text := toPrettyJson . -}}
{{- if regexMatch "[\\x{7f}-\\x{9f}]" $text -}}
{{- fail "rules: a rule holds a raw control character (DEL or a C1 code, U+007F-U+009F), which no YAML file may; write it as an escape in the pattern, e.g. \\x7f" -}}
{{- end -}}
{{- $text -}}
{{- end -}}
{{- end -}}

{{/* OTEL_RESOURCE_ATTRIBUTES from the resourceAttributes map, keys sorted. */}}
{{- define "vllm-trace-bridge.resourceAttributes" -}}
{{- $pairs := list -}}
{{- range $k, $v := .Values.resourceAttributes -}}
{{- $pairs = append $pairs (printf "%s=%v" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}


{{/*
The OTLP ports the NetworkPolicy lets out, comma-separated: networkPolicy.otlpPorts when given;
else the port of otlp.endpoint (its explicit port, else 443 for https and 80 for http, as the
exporter connects), so an endpoint on 443 is not silently blocked; else, with no endpoint here
(it comes from extraEnv), both OTLP defaults.
*/}}
{{- define "vllm-trace-bridge.otlpPorts" -}}
{{- if .Values.networkPolicy.otlpPorts -}}
{{- join "," .Values.networkPolicy.otlpPorts -}}
{{- else -}}
{{- $ep := .Values.otlp.endpoint | default "" -}}
{{- if not $ep -}}
4317,4318
{{- else -}}
{{- $u := urlParse (ternary $ep (printf "http://%s" $ep) (contains "://" $ep)) -}}
{{- if regexMatch ":[0-9]+$" $u.host -}}
{{- regexFind "[0-9]+$" $u.host -}}
{{- else if eq $u.scheme "https" -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
