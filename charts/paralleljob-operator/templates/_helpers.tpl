{{/* Names, labels and the pieces shared by several templates. */}}

{{- define "paralleljob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: release name + chart name, unless the release name already contains the chart name.
Truncated to 63 characters because some Kubernetes name fields are limited to that (DNS-1123 labels).
*/}}
{{- define "paralleljob-operator.fullname" -}}
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

{{- define "paralleljob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "paralleljob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "paralleljob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "paralleljob-operator.labels" -}}
helm.sh/chart: {{ include "paralleljob-operator.chart" . }}
{{ include "paralleljob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: paralleljob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "paralleljob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "paralleljob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest when a digest is given, else repository:tag (tag defaults to appVersion). */}}
{{- define "paralleljob-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "paralleljob-operator.trainerImage" -}}
{{- $image := .Values.jobDefaults.trainerImage }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}

{{/*
Every volume source of a core/v1 Volume, as JSON: the ones the ParallelJob CRD declares (operator/paralleljob/api
types.VOLUME_SOURCES; tests/chart/test_admission_policy.py checks that the two lists agree).
*/}}
{{- define "paralleljob-operator.volumeSources" -}}
["awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume"]
{{- end }}
