"""Makes the Apache Polaris catalog that bergstream's routers archive into, once (the compose stack's
polaris-setup): the catalog over an S3-compatible store without STS, so that clients bring their own keys,
and the right to manage its content for the principal whose credential is given.

    POLARIS_CREDENTIAL=client_id:client_secret python -m bergstream.deploy.polaris \\
        --uri http://polaris:8181 --catalog archive --location s3://archive/warehouse --s3-endpoint http://object-store:7070

Each step is skipped when done already: a catalog that exists is left as it is.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from bergstream.errors import ConfigError

CREDENTIAL_VARIABLE = "POLARIS_CREDENTIAL"
REALM = "POLARIS"


def catalog_request(name: str, location: str, s3_endpoint: str, region: str) -> dict[str, Any]:
    """The management API's body that creates catalog `name` with its tables under `location`."""
    return {
        "catalog": {
            "name": name,
            "type": "INTERNAL",
            "readOnly": False,
            "properties": {"default-base-location": location},
            "storageConfigInfo": {
                "storageType": "S3",
                "allowedLocations": [location],
                "endpoint": s3_endpoint,
                "pathStyleAccess": True,
                # No STS in front of the store: Polaris vends no credentials, clients use their own keys.
                "stsUnavailable": True,
                "region": region,
            },
        }
    }


class Polaris:
    """Polaris's management API, logged in with OAuth2 client credentials."""

    def __init__(self, uri: str, credential: str, timeout: float = 30.0) -> None:
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        client_id, _, secret = credential.partition(":")
        if not client_id or not secret:
            raise ConfigError(f"{CREDENTIAL_VARIABLE} must be client_id:client_secret")
        form = urllib.parse.urlencode(
            {"grant_type": "client_credentials", "scope": "PRINCIPAL_ROLE:ALL"}
        ).encode()
        login = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
        answer = self._call("POST", "/api/catalog/v1/oauth/tokens", form,
                            {"Authorization": f"Basic {login}",
                             "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        self.token = str(answer["access_token"])

    def _call(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.uri}{path}", data=body, method=method,
                                         headers={"Polaris-Realm": REALM, **(headers or {})})  # fmt: skip
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:
            text = answer.read().decode()
        return json.loads(text) if text.strip() else {}

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        return self._call(method, path, data, headers)

    def has_catalog(self, name: str) -> bool:
        try:
            self._json("GET", f"/api/management/v1/catalogs/{urllib.parse.quote(name)}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        return True

    def create_catalog(self, request: dict[str, Any]) -> None:
        self._json("POST", "/api/management/v1/catalogs", request)

    def grant_content(self, name: str) -> None:
        """Let the catalog's admin role (the root principal's) create namespaces and tables in it."""
        path = f"/api/management/v1/catalogs/{urllib.parse.quote(name)}/catalog-roles/catalog_admin/grants"
        self._json("PUT", path, {"grant": {"type": "catalog", "privilege": "CATALOG_MANAGE_CONTENT"}})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uri", required=True, help="Polaris's address, e.g. http://polaris:8181")
    parser.add_argument("--catalog", required=True)
    parser.add_argument("--location", required=True, help="where its tables go, s3://bucket/prefix")
    parser.add_argument("--s3-endpoint", required=True)
    parser.add_argument("--region", default="us-east-1")
    args = parser.parse_args(argv)
    credential = os.environ.get(CREDENTIAL_VARIABLE)
    if not credential:
        sys.exit(f"set {CREDENTIAL_VARIABLE}=client_id:client_secret, the principal that makes the catalog")
    try:
        polaris = Polaris(args.uri, credential)
        if polaris.has_catalog(args.catalog):
            print(f"catalog {args.catalog} exists at {args.uri}")
        else:
            request = catalog_request(args.catalog, args.location, args.s3_endpoint, args.region)
            polaris.create_catalog(request)
            print(f"catalog {args.catalog} created at {args.uri}, its tables under {args.location}")
        polaris.grant_content(args.catalog)
    except (OSError, ConfigError) as error:
        answer = error.read() if isinstance(error, urllib.error.HTTPError) else b""
        detail = answer.decode(errors="replace")[:500]
        sys.exit(f"Polaris at {args.uri}, catalog {args.catalog}: {error} {detail}".strip())


if __name__ == "__main__":
    main()
