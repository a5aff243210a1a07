"""Placing pods: the standalone loop (:mod:`.core`), one placement step (:mod:`.placement`), extender mode (:mod:`.extender`), and the indexes that turn a change into a retry."""
