"""Webhooks: the subscriptions' URL rule, signing, the safe HTTP client, the delivery process (docs/integrating.md)."""
