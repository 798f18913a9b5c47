"""The admin side: the `authsvc` command and its subcommands, the operations layer every front door
writes through, and the audit trail's reading (README.md, "Layout"). The web path never imports it."""
