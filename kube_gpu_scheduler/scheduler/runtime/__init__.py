"""The process: settings, leader election, the HTTP endpoints and probes, metrics, the work queue and the garbage-collection pause."""
