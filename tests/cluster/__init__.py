"""A strict Kubernetes cluster on one machine, for the operator, chart and end-to-end tests.

kmock serves the API; the modules here make it refuse what kube-apiserver refuses and run what a cluster runs:
`apiserver` (storage, watch, the request pipeline and the thread that serves it), `statuses` (the API's error
objects), `auth` (bearer tokens and RBAC), `admission` (names, labels, sizes, immutable fields, OpenAPI schemas of
core kinds), `crd` (CustomResourceDefinitions: structural schema, defaults, pruning, CEL rules), `scheduler`
(binding pending pods to nodes that fit) and `kubelet` (a phase-only one, and one that runs pods as processes).
"""
