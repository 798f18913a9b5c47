"""The game-facing path: what a game server's request goes through (README.md, "Layout")."""
