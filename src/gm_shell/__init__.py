"""gm_shell: the effects around gm_core (mailboxes, payloads, compute backends, Session, CLI)."""
