# shellcheck shell=sh
# The install steps shared by scripts/install (from a checkout) and the Debian package's maintainer
# scripts (scripts/package): one copy of each. Sourced, not run; POSIX sh (dpkg runs postinst with it).
# With STAGED=true (scripts/install --root ROOT) the steps that need root or a running system print a
# "skip:" line instead; ROOT prefixes every path written.
: "${STAGED:=false}"
: "${ROOT:=}"

authsvc_step() { echo "==> $*"; }
authsvc_skip() { echo "skip: $* (staged install under $ROOT)"; }

# The service user, made once: a fixed system user rather than DynamicUser=, because the admin
# command must write the store as the user the service reads it as. And the admin API's socket
# group: its members (the web tier's user) may connect.
# authsvc_user USER STATE_DIR ADMIN_GROUP
authsvc_user() {
    authsvc_step "system user $1"
    if $STAGED; then
        authsvc_skip "useradd --system $1"
    elif getent passwd "$1" >/dev/null; then
        echo "exists"
    else
        useradd --system --user-group --home-dir "$2" --no-create-home \
            --shell /usr/sbin/nologin --comment "authsvc service" "$1"
    fi
    if $STAGED; then
        authsvc_skip "groupadd --system $3"
    elif ! getent group "$3" >/dev/null; then
        groupadd --system "$3"
    fi
}

# The token secret (created once, 0600), the settings' owners and modes, the state directory.
# CONF_DIR is sticky and group-writable: the admin command (USER) replaces the token secret, which
# it owns, by a rename (authsvc secret rotate), but no file of root's there (docs/design.md, "Freshness").
# authsvc_conf USER CONF_DIR STATE_DIR PYTHON
authsvc_conf() {
    install -d -m 1770 "$ROOT$2"
    secret=$ROOT$2/token-secret
    if [ -e "$secret" ]; then
        echo "$2/token-secret exists, kept"
    else
        (umask 077 && "$4" -c 'import secrets; print(secrets.token_hex(32))' >"$secret.new")
        mv "$secret.new" "$secret"
        echo "$2/token-secret created (0600)"
    fi
    chmod 0600 "$secret"
    install -d -m 0750 "$ROOT$3"
    if $STAGED; then
        authsvc_skip "chown root:$1 $2 $2/authsvc.toml $2/admin.toml; chown $1: $2/token-secret $3"
    else
        chown "root:$1" "$2" "$2/authsvc.toml" "$2/admin.toml"
        chmod 0640 "$2/authsvc.toml" "$2/admin.toml"
        chown "$1:$1" "$secret" "$3"
    fi
}

# Create or migrate the store, as the service user (the admin command ADMIN_CMD runs as it). With
# CONF_DIR/owner.toml (PostgreSQL: the role that owns the tables, docs/stores.md) as the owner;
# without it, with the service's settings, which migrate a SQLite store and leave an up-to-date
# PostgreSQL store as it is. A PostgreSQL store that needs a migration stops here, before any restart.
# authsvc_init ADMIN_CMD CONF_DIR HOW_TO_RETRY
authsvc_init() {
    if [ -e "$2/owner.toml" ]; then
        AUTHSVC_CONFIG=$2/owner.toml "$1" init
    elif ! "$1" init; then
        echo "The store was not migrated with $2/authsvc.toml's settings. A PostgreSQL store is" >&2
        echo "migrated by its owner: put owner.toml in $2 (docs/stores.md) and $3, or run" >&2
        echo "AUTHSVC_CONFIG=$2/owner.toml authsvc init where it is (docs/operations.md, section 9)." >&2
        echo "Nothing was restarted: the running services are the previous release's." >&2
        return 1
    fi
}

# Every unit given that is running keeps the previous release's code until restarted:
# try-restart restarts those that run and starts none (docs/operations.md, section 9).
# authsvc_try_restart UNIT...
authsvc_try_restart() {
    if $STAGED; then
        authsvc_skip "systemctl try-restart $*"
    elif [ -d /run/systemd/system ]; then
        systemctl try-restart "$@"
    else
        echo "no systemd running: nothing to restart"
    fi
}

# nginx: enable a site (a link in sites-enabled) once its certificate exists, drop Debian's default
# site (also a default_server on port 80), check the configuration and reload.
# authsvc_enable_site NGINX_DIR SITE_FILE_NAME CERT HOW_TO_RETRY
authsvc_enable_site() {
    mkdir -p "$ROOT$1/sites-enabled"
    if $STAGED; then
        ln -sfn "$1/sites-available/$2" "$ROOT$1/sites-enabled/$2"
        authsvc_skip "nginx -t; systemctl reload nginx"
    elif [ ! -e "$3" ]; then
        echo "no certificate at $3 yet: site $2 left disabled."
        echo "Get one (docs/operations.md, 'Certificates'), then $4."
    else
        ln -sfn "$1/sites-available/$2" "$1/sites-enabled/$2"
        if [ -L "$1/sites-enabled/default" ]; then
            rm "$1/sites-enabled/default"
            echo "removed the link sites-enabled/default (Debian's default site)"
        fi
        nginx -t
        if [ -d /run/systemd/system ]; then
            systemctl reload-or-restart nginx
        else
            nginx -s reload
        fi
    fi
}
