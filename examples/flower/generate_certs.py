"""Make test certificates for the SuperLink and authentication keys for the SuperNodes.

    python examples/flower/generate_certs.py --out certs --host 127.0.0.1 --host localhost \
        --nodes 4

writes certs/ca.crt, certs/server.pem, certs/server.key (TLS: the SuperLink's certificate for
the given hosts, signed by a fresh CA) and certs/supernode-K, certs/supernode-K.pub (EC P-384
keys in OpenSSH format, one pair per SuperNode). See docs/flower.md for where each file goes.
For production, have your own CA sign the SuperLink's certificate.
"""

from __future__ import annotations

import argparse

from clusterfed.flower.certs import make_node_keys, make_tls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="certs", help="folder for the files (default certs)")
    parser.add_argument("--host", action="append", default=[],
                        help="a SuperLink address the certificate is valid for (IP or DNS "
                             "name); repeat it (default 127.0.0.1 and localhost)")
    parser.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs to make")
    parser.add_argument("--days", type=int, default=30, help="validity (default 30 days)")
    args = parser.parse_args()
    tls = make_tls(args.out, args.host or ["127.0.0.1", "localhost"], args.days)
    print(f"CA certificate       {tls.ca_cert}\nSuperLink certificate {tls.server_cert}\n"
          f"SuperLink key         {tls.server_key}")
    for private, public in make_node_keys(args.out, args.nodes):
        print(f"SuperNode key        {private} (public: {public})")


if __name__ == "__main__":
    main()
