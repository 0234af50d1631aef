"""The task's API: a secret made when the service starts, at /secret, and a counter of how often it was read."""
import http.server
import os
import secrets

SECRET = secrets.token_hex(8)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/secret":
            self.send_error(404)
            return
        body = SECRET.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", int(os.environ["API_PORT"])), Handler).serve_forever()
