"""Example applications instrumented with ragtrace."""
