"""Cluster profiles: schema, built-in YAML files, and the profile-cluster benchmarks."""

from meshplan.profiles.schema import ClusterProfile
from meshplan.profiles.registry import list_profiles, load_profile

__all__ = ["ClusterProfile", "list_profiles", "load_profile"]
