"""Handlers: load state through ports, call app.policy, apply the decision, record the ledger."""
