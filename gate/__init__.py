"""Evaluation of candidates and the deterministic deploy gate (rules in app.policy.gate_rules)."""
