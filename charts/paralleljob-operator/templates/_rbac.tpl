{{/*
The operator's RBAC rules, grouped as kopf's documentation groups them: what the framework needs, then what the
application needs. tests/chart/test_rbac.py checks these against the API calls the operator makes in
tests/operator, so a rule here that the operator does not use fails the tests, and so does a missing one.
Nothing here touches Secrets, and no rule uses a wildcard.
*/}}

{{- define "paralleljob-operator.clusterRules" -}}
# Framework: runtime observation of CRDs, so that kopf notices the ParallelJob CRD being installed or upgraded
# after the operator started.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
# Framework: runtime observation of namespaces, so that kopf starts watching a listed namespace that is created
# after the operator started. Only needed when the operator watches listed namespaces.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
# Application: the planner's view of the cluster: GPU nodes, their labels, allocatable resources and readiness.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end }}

{{- define "paralleljob-operator.namespacedRules" -}}
# Framework: posting Events about handler progress and errors, and the operator's own placement, start,
# restart, completion and failure Events, shown by `kubectl describe pj`.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Application: watching and handling ParallelJobs (kopf patches its bookkeeping annotations onto the object).
- apiGroups: [paralleljob.io]
  resources: [paralleljobs]
  verbs: [get, list, watch, patch]
# Application: phase, conditions, placement and progress.
- apiGroups: [paralleljob.io]
  resources: [paralleljobs/status]
  verbs: [get, patch]
# Application: one pod per node rank; deleted on gang restarts and after completion.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# Application: the job's headless Service (rank-0 DNS) and its ConfigMap (job.json, DeepSpeed config, NCCL env).
# Both are owned by the ParallelJob, so the garbage collector deletes them with it.
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, create]
# Application: the per-job progress account: rank 0 patches its own job's status through a ServiceAccount whose
# Role allows exactly that. The operator may grant it only because it holds those permissions itself (above).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create]
{{- end }}
