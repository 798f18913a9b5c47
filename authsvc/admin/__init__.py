"""The admin side: the operations layer every front door writes through, and the audit trail's reading."""
