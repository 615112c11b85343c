"""Routing: request queues, worker selection and the routing policies (pure decision code)."""
