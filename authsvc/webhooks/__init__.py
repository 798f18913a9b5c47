"""Webhooks: what a subscription's URL may be, and sending the events outbox (store/events.py) to
subscribers."""
