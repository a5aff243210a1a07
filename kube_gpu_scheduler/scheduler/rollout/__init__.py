"""Rollouts that move GPUs between the replicas of one StatefulSet: the eviction decision (:mod:`.eviction`) and the standalone path (:mod:`.standalone`)."""
