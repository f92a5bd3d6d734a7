"""The web page's Models view in a real headless Chromium (issue 44),
against a server with a model store whose Ollama names come from the tests'
fake registry (no keys: loopback, so the admin actions show): a pull held by
the registry is cancelled from the page (``DELETE /v1/admin/pulls/{model}``:
the pull ends ``cancelled`` at its next chunk); pulled again, its bar reaches
100 % and the model appears with its source and quant; it loads and
unloads; it is deleted. One server, one browser."""

from __future__ import annotations

import httpx

from .chromium import LivePage
from .views_support import bundled_gguf, pulling_server
from .web_support import enter, foreign, shot

NAME = "smollm2:135m"
ROW = f'#m-rows tr[data-model="{NAME}"]'
PULL = f'.mpull[data-model="{NAME}"]'


def cells(page: LivePage) -> list[str] | None:
    return page.js(f"(() => {{ const tr = document.querySelector('{ROW}');"
                   " return tr ? [...tr.children].map((td) => td.textContent) : null; })()")  # fmt: skip


def click(page: LivePage, selector: str) -> None:
    page.wait(f"!!document.querySelector('{selector}')")
    page.js(f"document.querySelector('{selector}').click()")


def test_pull_cancel_load_unload_delete(tmp_path):
    import os

    with pulling_server(str(tmp_path)) as (srv, reg):
        nothing = httpx.delete(srv.url + "/v1/admin/pulls/nothing:1", timeout=10)
        assert nothing.status_code == 404 and nothing.json()["error"]["param"] == "model"
        hold = reg.hold(reg.model_digest("smollm2", "135m"))
        with LivePage(srv.url + "/#/models") as page:
            page.wait("!document.querySelector('#view-models .m-actions').hidden")  # loopback, no keys: admin
            page.wait("document.getElementById('m-config-text').textContent.includes('--config')")
            page.js("document.getElementById('m-name').focus()")
            page.type(NAME)
            enter(page)
            assert hold.arrived.wait(60), "the pull never asked for its blob"
            click(page, f"{PULL} button")  # Cancel
            hold.release()
            page.wait(f"document.querySelector('{PULL}')?.classList.contains('cancelled')")
            assert "cancelled" in page.js(f"document.querySelector('{PULL} .reason').textContent")
            (ended,) = httpx.get(srv.url + "/v1/admin/pulls", timeout=10).json()["data"]
            assert ended["state"] == "cancelled" and "cancelled" in ended["error"]
            assert cells(page) is None

            page.js("document.getElementById('m-name').focus()")
            page.type(NAME)
            enter(page)
            page.wait(f"document.querySelector('{PULL}')?.classList.contains('finished')")
            size = os.path.getsize(bundled_gguf())
            bar = page.js(
                f"(() => {{ const b = document.querySelector('{PULL} progress'); return [b.max, b.value]; }})()"
            )
            assert bar == [size, size] and page.js(f"document.querySelector('{PULL} .pct').textContent") == "100%"
            page.wait(f"!!document.querySelector('{ROW}')")
            name, source, quant, on_disk = cells(page)[:4]
            assert (name, source, quant, on_disk) == (NAME, "Ollama", "Q4_1", f"{size / 2**20:.1f} MiB")
            shot(page, "models")

            click(page, f'{ROW} button[aria-label^="Load"]')
            page.wait(f"document.querySelector('{ROW}').children[7].textContent === 'loaded'", timeout=120)
            row = cells(page)
            assert row[4] == "2048" or row[4].isdigit(), row  # its context
            assert row[5].endswith("MiB") and "chat" in row[6], row  # resident, capabilities
            click(page, f'{ROW} button[aria-label^="Unload"]')
            page.wait(f"document.querySelector('{ROW}').children[7].textContent !== 'loaded'", timeout=60)

            click(page, f'{ROW} button[aria-label^="Delete"]')
            page.wait(f"!document.querySelector('{ROW}')")
            assert httpx.get(srv.url + "/api/tags", timeout=10).json()["models"] == []
            assert not foreign(page, srv.url) and not page.errors(), page.errors()
