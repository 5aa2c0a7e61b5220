{{/*
The operator's RBAC rules, grouped as kopf's documentation groups them: what the framework needs, then what the
application needs. tests/operator/test_chart_permissions.py runs the operator with these settings on the real API
server and checks that the calls it makes are exactly what these rules allow: a rule nobody uses fails it, and so
does a call no rule allows. Nothing here touches Secrets, and no rule uses a wildcard.
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
{{- if .Values.slowNodeLabel.enabled }}
# Application: the label on a node the operator names slow (slowNodeLabel.enabled), for administrators.
- apiGroups: [""]
  resources: [nodes]
  verbs: [patch]
{{- end }}
# Application: the GPUs already held by bound pods, in every namespace, so that no GPU is planned twice: the
# usage index lists them in pages, then watches them (only bound, unfinished pods, selected server-side);
# and the phase changes of the ParallelJobs' own pods (selected server-side by the job label).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Application: reservations. An admission plans around the nodes every ParallelJob of the cluster holds, in
# every namespace, also those this operator does not manage (another team's operator placed them): it lists
# the jobs' attempt records, the `-config` ConfigMaps labelled paralleljob.io/reserving=true (selected
# server-side), so the list is cluster-wide even when watchNamespaces limits what it manages.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list]
# Application: the admission order reads the value of the PriorityClass a job's pods name.
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- if .Values.kueue.enabled }}
# Application: Kueue (kueue.enabled). The admitted flavours' node labels and taints, where an admitted gang is
# placed, and the value of the WorkloadPriorityClass a queued job names; the ClusterQueue and Topology behind a
# job's queue, whose levels its Workload's topology request names (Kueue's TAS).
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses, clusterqueues, topologies]
  verbs: [get]
{{- end }}
{{- if .Values.leaderElection.enabled }}
# Application: rival operators. The leader lists the Leases labelled paralleljob.io/operator-lease in every
# namespace (selected server-side, so no node heartbeat is read), to report another operator that manages
# some of the same namespaces.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [list]
{{- end }}
{{- end }}

{{- define "paralleljob-operator.leaseRules" -}}
# Application: leader election on the release's Lease: read it, create it the first time, and renew or take
# it over (update). Granted on that Lease only, except create, which cannot be limited to a name.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ include "paralleljob-operator.leaseName" . }}]
  verbs: [get, update]
# Application: the RivalOperator Event, posted on the release's Lease when another operator's Lease says it
# manages some of the same namespaces.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{- define "paralleljob-operator.nodeLeaseRules" -}}
# Application: a lost node, noticed by its gang (recovery.lostNodeLeaseSeconds above 0). The Lease of a node its
# gang reports lost, read only then (one get per reported node): the kubelet's heartbeat, the second signal the
# operator waits for before it replaces the node. Granted in kube-node-lease only, where the kubelets keep them.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get]
{{- end }}

{{- define "paralleljob-operator.admissionLockRules" -}}
# Application: the cluster-wide admission lock, held around every admission (read, create the first time,
# take and release with update). Granted on that Lease only, except create, which cannot be limited to a name.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [{{ .Values.admissionLock.name }}]
  verbs: [get, update]
{{- end }}

{{- define "paralleljob-operator.namespacedRules" -}}
{{- if .Values.kueue.enabled }}
# Application: Kueue (kueue.enabled). The Workload of each job labelled kueue.x-k8s.io/queue-name, created and
# owned by the job, watched (selected by the job label) for Kueue's admission and eviction; its status patched
# to give the quota back (an evicted gang stopped, a gang that cannot be placed) and to say Finished. On a
# MultiKueue worker, the Workload Kueue made for a dispatched job is patched once: the job becomes its owner.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch, create, patch]
# The LocalQueue a job names, read once when its Workload is created: which ClusterQueue (and Topology) it uses.
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
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
# Application: phase, conditions, placement, excluded nodes, and the progress the operator copies, validated,
# from rank 0's progress ConfigMap. Only the operator writes a job's status.
- apiGroups: [paralleljob.io]
  resources: [paralleljobs/status]
  verbs: [patch]
# Application: one pod per node rank, listed by the job's label on each pass (their phase changes arrive
# through the cluster-wide, label-selected watch above); deleted on gang restarts and after completion
# (gracefully; a pod stuck Terminating on a lost node is force-deleted, which is also `delete`). `get` reads a
# pod that already holds a rank's name, to tell the job's own from a foreign one (a name conflict).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, create, delete]
# Application: the job's headless Service (rank-0 DNS). It is owned by the ParallelJob, so the garbage
# collector deletes it with the job. `get` reads an existing one to check that it is this job's and not a
# deleted namesake's, which the collector has not removed yet.
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
# Application: the job's ConfigMap (job.json, DeepSpeed config, plan, network and the attempt record the
# operator decides from), created at the first admission and patched with each decision and each new attempt,
# and rank 0's progress ConfigMap, read and watched (list, watch: only those labelled paralleljob.io/progress)
# and copied into status. Each job's progress Role also grants `patch` on that job's progress ConfigMap, which
# Kubernetes lets the operator grant only because it holds it.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch]
# Application: the per-job progress account: rank 0 patches its own progress ConfigMap through a
# ServiceAccount whose Role allows exactly that (resourceNames). `get` as for the Service.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create]
{{- end }}
