"""tuneharness control plane: settings, domain types, policy, ledger, budget, CLI."""
