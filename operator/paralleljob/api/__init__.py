"""The ParallelJob API (paralleljob.io/v1alpha1): types, parsing, validation and CRD generation.

Pure code: it imports neither kubernetes, kopf nor torch. Everything that judges a job calls
`validate_document()`; everything that needs the CRD calls `crd.build_crd()`.
"""

from paralleljob.api.problems import Problem
from paralleljob.api.validation import ResolvedJob, ValidationResult, validate_document

__all__ = ["Problem", "ResolvedJob", "ValidationResult", "validate_document"]
