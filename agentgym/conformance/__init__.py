"""``agentgym check-env URL``: wire API v1 conformance checks for any env server; the checks
(``checks``) and the runner that plays them in order (``runner``)."""
