{{/*
The operator's RBAC rules, grouped as kopf's documentation groups them: what the framework needs, then what the
application needs. tests/chart/test_operator_on_emulator.py runs the operator with these settings and checks
that the calls it makes are exactly what these rules allow: a rule nobody uses fails it, and so does a call no
rule allows. Nothing here touches Secrets, and no rule uses a wildcard.
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
# Application: the GPUs already held by bound pods, in every namespace, so that no GPU is planned twice: the
# usage index lists them in pages, then watches them (only bound, unfinished pods, selected server-side);
# and the phase changes of the ParallelJobs' own pods (selected server-side by the job label).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Application: the admission order reads the value of the PriorityClass a job's pods name.
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}

{{- define "paralleljob-operator.namespacedRules" -}}
# Application: the operator's placement, start, restart, completion and failure Events, shown by
# `kubectl describe pj`. (kopf's own event posting is turned off.)
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Application: watching ParallelJobs. The operator never writes a job's spec or metadata: the nodes a gang
# restart excludes are kept in its status.
- apiGroups: [paralleljob.io]
  resources: [paralleljobs]
  verbs: [get, list, watch]
# Application: phase, conditions, placement and excluded nodes. Each job's progress account is granted the
# same `patch` on its own job's status, and Kubernetes lets the operator grant only what it holds.
- apiGroups: [paralleljob.io]
  resources: [paralleljobs/status]
  verbs: [patch]
# Application: one pod per node rank, listed by the job's label on each pass (their phase changes arrive
# through the cluster-wide, label-selected watch above); deleted on gang restarts and after completion
# (gracefully; a pod stuck Terminating on a lost node is force-deleted, which is also `delete`).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, create, delete]
# Application: the job's headless Service (rank-0 DNS). It is owned by the ParallelJob, so the garbage
# collector deletes it with the job. `get` reads an existing one to check that it is this job's and not a
# deleted namesake's, which the collector has not removed yet.
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
# Application: the job's ConfigMap (job.json, DeepSpeed config, plan, network), replaced on each attempt.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, delete]
# Application: the per-job progress account: rank 0 patches its own job's status through a ServiceAccount
# whose Role allows exactly that (see the paralleljobs/status rule above). `get` as for the Service.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create]
{{- end }}
