{{/*
The operator's command line and environment: the one place where chart values become `paralleljob operator`
settings. The image's ENTRYPOINT is ["paralleljob", "operator"], so these are its arguments.
*/}}

{{- define "paralleljob-operator.args" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.operator.healthPort }}/healthz
- --metrics-port={{ .Values.metrics.port }}
- --log-format={{ .Values.operator.logFormat }}
- --log-level={{ .Values.operator.logLevel }}
{{- end }}

{{- define "paralleljob-operator.env" -}}
- name: PARALLELJOB_TRAINER_IMAGE
  value: {{ include "paralleljob-operator.trainerImage" . | quote }}
- name: PARALLELJOB_DEFAULT_FABRIC
  value: {{ .Values.jobDefaults.fabric | quote }}
- name: PARALLELJOB_DEFAULT_NCCL_ENV
  value: {{ .Values.jobDefaults.ncclEnv | toJson | quote }}
- name: PYTHONUNBUFFERED
  value: "1"
{{- end }}
