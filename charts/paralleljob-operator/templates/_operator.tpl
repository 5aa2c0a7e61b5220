{{/*
The operator's command line: the one place where chart values become `paralleljob operator` flags (see
operator/paralleljob/commands/operator.py). The image's ENTRYPOINT is ["paralleljob", "operator"], so these are
its arguments. tests/chart/test_operator_args.py parses them with the operator's own argument parser.
*/}}

{{- define "paralleljob-operator.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- {{ printf "--namespace=%s" . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
- --metrics-port={{ .Values.metrics.port }}
- --log-format={{ .Values.operator.logFormat }}
- --log-level={{ .Values.operator.logLevel }}
- {{ printf "--trainer-image=%s" (include "paralleljob-operator.trainerImage" .) | quote }}
- --default-fabric={{ .Values.jobDefaults.fabric }}
{{- range $name, $value := .Values.jobDefaults.ncclEnv }}
- {{ printf "--default-nccl-env=%s=%s" $name $value | quote }}
{{- end }}
{{- end }}
