"""``http-get``: a small HTTP(S) probe for the charts' ``helm test`` pods."""

from __future__ import annotations

import argparse
import logging
import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from kube_gpu_scheduler.check.results import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, Result, log, log_result
from kube_gpu_scheduler.kube.tls import client_context


def cmd_http_get(args: argparse.Namespace) -> int:
    url: str = args.url
    if not url.startswith(("http://", "https://")):
        log.error("only http:// and https:// URLs", extra={"url": url})
        return EXIT_USAGE
    try:
        context = client_context(args.cafile) if url.startswith("https://") else None
    except (OSError, ssl.SSLError) as err:
        # In a pod: the CA's Secret or ConfigMap is not mounted where the chart says.
        log.error(
            f"cannot load --cafile {args.cafile}: {err.__class__.__name__}: {err}",
            extra={"url": url, "cafile": args.cafile},
        )
        return EXIT_MISMATCH
    attempts = args.retries + 1
    for attempt in range(1, attempts + 1):
        actual: Any
        try:
            req = urllib.request.Request(url, method="GET")  # noqa: S310 - scheme checked above
            with urllib.request.urlopen(req, timeout=args.timeout, context=context) as resp:  # noqa: S310
                actual = resp.status
                resp.read(65536)
        except urllib.error.HTTPError as err:
            actual = err.code
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            actual = f"{err.__class__.__name__}: {reason}"
        ok = actual == args.expect
        result = Result(
            "http", args.expect, actual, ok, "-", {"url": url, "attempt": attempt, "of": attempts}
        )
        last = attempt == attempts
        log_result(result, logging.INFO if ok else (logging.ERROR if last else logging.WARNING))
        if ok:
            return EXIT_OK
        if not last:
            time.sleep(args.delay)
    return EXIT_MISMATCH
