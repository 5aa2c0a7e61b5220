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
- {{ printf "--allowed-volume-types=%s" (join "," .Values.policy.allowedVolumeTypes) | quote }}
- {{ printf "--allowed-service-accounts=%s" (join "," .Values.policy.allowedServiceAccounts) | quote }}
- {{ printf "--forbidden-env=%s" (join "," .Values.policy.forbiddenEnv) | quote }}
- {{ printf "--allowed-priority-classes=%s" (join "," .Values.policy.allowedPriorityClasses) | quote }}
- {{ printf "--allowed-metadata-domains=%s" (join "," .Values.policy.allowedMetadataDomains) | quote }}
{{- with .Values.recovery }}
- --start-timeout={{ .startTimeoutSeconds }}
- --container-creating-timeout={{ .containerCreatingTimeoutSeconds }}
- --image-pull-retries={{ .imagePullRetries }}
- --not-ready-grace={{ .notReadyGraceSeconds }}
- --force-delete-after={{ .forceDeleteAfterSeconds }}
- --lost-node-lease={{ .lostNodeLeaseSeconds }}
- --restart-hold={{ .restartHoldSeconds }}
- --resync-period={{ .resyncPeriodSeconds }}
{{- end }}
{{- if .Values.slowNodeLabel.enabled }}
- --slow-node-label={{ .Values.slowNodeLabel.key }}
{{- end }}
- --pod-run-as-user={{ .Values.jobPods.runAsUser }}
- --pod-run-as-group={{ .Values.jobPods.runAsGroup }}
- --pod-fs-group={{ .Values.jobPods.fsGroup }}
- {{ ternary "--pod-read-only-root-filesystem" "--no-pod-read-only-root-filesystem" .Values.jobPods.readOnlyRootFilesystem }}
- {{ ternary "--rdma-ipc-lock" "--no-rdma-ipc-lock" .Values.jobPods.rdmaIpcLock }}
{{- if .Values.leaderElection.enabled }}
- --leader-elect
- --leader-election-namespace={{ .Release.Namespace }}
- --leader-election-lease={{ include "paralleljob-operator.leaseName" . }}
- --lease-seconds={{ .Values.leaderElection.leaseSeconds }}
{{- end }}
{{- if .Values.kueue.enabled }}
- --kueue
{{- end }}
- --kueue-checkpoint-grace={{ .Values.kueue.checkpointGraceSeconds }}
{{- if .Values.admissionLock.enabled }}
- --admission-lock={{ .Values.admissionLock.namespace }}/{{ .Values.admissionLock.name }}
{{- else }}
- --admission-lock=none
{{- end }}
{{- end }}

{{- define "paralleljob-operator.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "paralleljob-operator.fullname" .) -}}
{{- end }}
