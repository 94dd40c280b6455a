#!/usr/bin/python3
"""Runs the documentation: every runnable shell block and every link.

A shell block is runnable when the line before its fence is

    <!-- doctest -->                      run it
    <!-- doctest: fixture=hf-llama -->    first lay out a fixture (tests/docs/fixtures/NAME.sh)

A page's runnable blocks run in order, as one reader would type them, in a
scratch folder of its own where `build`, `configs` and `scripts` lead to the
checkout and the build, and where a fixture's files are linked in (a fixture
is made once per run and shared). A block runs under `bash -euo pipefail`; the
first that fails stops its page, with the page, the block's line and the
output's tail. Background processes a block starts (a server) are killed when
the page ends.

    doctest.py run  SRC BUILD [PAGE.md ...]   the runnable blocks (default: README.md, docs/*.md)
    doctest.py links SRC [PAGE.md ...]        every relative link and #anchor resolves
    doctest.py self-test SRC BUILD            a misspelt key and a broken link are caught
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MARK = re.compile(r'^<!--\s*doctest(?::\s*(.*?))?\s*-->\s*$')
FENCE = re.compile(r'^(\s*)(```+|~~~+)\s*(\S*)')
BLOCK_TIMEOUT = int(float(os.environ.get('NK_TIME_SCALE', '1')) * 600)


def pages(src, given):
    if given:
        return [os.path.abspath(p) for p in given]
    out = [os.path.join(src, 'README.md')]
    docs = os.path.join(src, 'docs')
    out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
    return out


def scan(path):
    """(runnable blocks, links, anchors) of a markdown page, skipping fenced code."""
    lines = open(path, encoding='utf-8').read().split('\n')
    blocks, links, anchors, seen = [], [], set(), {}
    i, pending = 0, None
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            pending = (i + 1, m.group(1) or '')
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            indent, ticks, lang = f.group(1), f.group(2), f.group(3)
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(ticks):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            if pending is not None:
                if pending[0] != i or lang not in ('sh', 'bash', 'shell'):
                    sys.exit(f'{path}:{pending[0]}: a doctest mark must stand on the line '
                             'right before a ```sh fence')
                opts = dict(kv.split('=', 1) for kv in pending[1].split() if '=' in kv)
                blocks.append((i + 1, '\n'.join(body), opts))
                pending = None
            i = j + 1
            continue
        if pending is not None and pending[0] != i:
            sys.exit(f'{path}:{pending[0]}: a doctest mark must stand on the line right '
                     'before a ```sh fence')
        h = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if h:
            slug = github_slug(h.group(2))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f'{slug}-{n}')
        for m in re.finditer(r'(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)', strip_code(line)):
            links.append((i + 1, m.group(1)))
        i += 1
    return blocks, links, anchors


def strip_code(line):
    return re.sub(r'`[^`]*`', '', line)


def github_slug(text):
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)
    text = text.replace('`', '').lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def check_links(src, paths):
    bad = []
    cache = {}
    for path in paths:
        _, links, _ = cache.setdefault(path, scan(path))
        for line, target in links:
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            where = f'{os.path.relpath(path, src)}:{line}'
            if not os.path.exists(dest):
                bad.append(f'{where}: link to {target}: {os.path.relpath(dest, src)} does not exist')
                continue
            if anchor:
                if not dest.endswith('.md'):
                    bad.append(f'{where}: link to {target}: an anchor into a file that is not markdown')
                    continue
                if dest not in cache:
                    cache[dest] = scan(dest)
                if anchor not in cache[dest][2]:
                    bad.append(f'{where}: link to {target}: no heading "#{anchor}" in '
                               f'{os.path.relpath(dest, src)}')
    for b in bad:
        print(b)
    print(f'links: {sum(len(cache[p][1]) for p in paths)} checked in {len(paths)} pages, '
          f'{len(bad)} broken')
    return 0 if not bad else 1


def make_fixture(src, build, name, root):
    out = os.path.join(root, 'fixtures', name)
    if os.path.isdir(out):
        return out
    script = os.path.join(src, 'tests', 'docs', 'fixtures', name + '.sh')
    if not os.path.exists(script):
        sys.exit(f'no fixture {name}: {script} does not exist')
    tmp = out + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    link_checkout(src, build, tmp)
    r = subprocess.run(['bash', '-euo', 'pipefail', script], cwd=tmp, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT)
    if r.returncode != 0:
        print(r.stdout[-4000:])
        sys.exit(f'fixture {name} ({script}) failed with exit code {r.returncode}')
    for link in ('build', 'configs', 'scripts'):
        os.unlink(os.path.join(tmp, link))
    os.rename(tmp, out)
    return out


def link_checkout(src, build, where):
    os.symlink(build, os.path.join(where, 'build'))
    os.symlink(os.path.join(src, 'configs'), os.path.join(where, 'configs'))
    os.symlink(os.path.join(src, 'scripts'), os.path.join(where, 'scripts'))


def kill_groups(groups):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass  # the group is gone
        time.sleep(0.2)


def tail(path, n=3000):
    with open(path, errors='replace') as f:
        return f.read()[-n:]


def run_page(src, build, path, root):
    blocks, _, _ = scan(path)
    if not blocks:
        return 0, 0
    name = os.path.relpath(path, src)
    work = os.path.join(root, re.sub(r'[^\w.-]', '_', name))
    os.makedirs(work)
    link_checkout(src, build, work)
    env = dict(os.environ)
    env.setdefault('NEKTON_ASSETS', os.path.join(src, 'assets'))
    env['PYTHONUNBUFFERED'] = '1'
    groups = []
    try:
        for line, body, opts in blocks:
            for fx in filter(None, opts.get('fixture', '').split(',')):
                made = make_fixture(src, build, fx, root)
                for entry in os.listdir(made):
                    dst = os.path.join(work, entry)
                    if not os.path.exists(dst):
                        os.symlink(os.path.join(made, entry), dst)
            t0 = time.time()
            # Output to a file, not a pipe: a server the block leaves running
            # holds its output open, and the block is over when bash exits.
            log = os.path.join(work, f'.doctest-{line}.log')
            with open(log, 'w') as f:
                p = subprocess.Popen(['bash', '-euo', 'pipefail', '-c', body], cwd=work, env=env,
                                     stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            groups.append(p.pid)
            try:
                p.wait(timeout=BLOCK_TIMEOUT)
            except subprocess.TimeoutExpired:
                kill_groups([p.pid])
                p.wait()
                print(f'FAIL {name}:{line}: the block ran past {BLOCK_TIMEOUT} s\n'
                      f'{tail(log)}')
                return len(blocks), 1
            out = tail(log)
            if p.returncode != 0:
                print(f'FAIL {name}:{line}: exit code {p.returncode}\n--- block ---\n{body}\n'
                      f'--- output (tail) ---\n{out}')
                return len(blocks), 1
            print(f'ok   {name}:{line} ({time.time() - t0:.1f} s)')
    finally:
        kill_groups(groups)
    return len(blocks), 0


def run(src, build, paths, keep=False):
    root = tempfile.mkdtemp(prefix='nk-doctest-')
    total = failed = 0
    try:
        for path in paths:
            n, f = run_page(src, build, path, root)
            total += n
            failed += f
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f'doctest: {total} runnable blocks in {len(paths)} pages, {failed} pages failed')
    return 0 if failed == 0 else 1


def self_test(src, build):
    """The runner catches what it is for: a misspelt key and a broken link."""
    here = os.path.join(src, 'tests', 'docs')
    r = subprocess.run([sys.executable, __file__, 'run', src, build,
                        os.path.join(here, 'bad_key.md')],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ok = r.returncode != 0 and 'train.stepz' in r.stdout and 'bad_key.md:' in r.stdout
    print(('ok  ' if ok else 'FAIL') + ' a block with a misspelt key fails, naming the key')
    if not ok:
        print(r.stdout[-2000:])
    r2 = subprocess.run([sys.executable, __file__, 'links', src,
                         os.path.join(here, 'bad_links.md')],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ok2 = (r2.returncode != 0 and 'no_such_page.md does not exist' in r2.stdout and
           'no heading "#no-such-heading"' in r2.stdout and '2 broken' in r2.stdout)
    print(('ok  ' if ok2 else 'FAIL') + ' a missing page and a missing heading are broken links')
    if not ok2:
        print(r2.stdout[-2000:])
    return 0 if ok and ok2 else 1


def main(argv):
    if len(argv) < 3 or argv[1] not in ('run', 'links', 'self-test'):
        sys.exit(__doc__)
    src = os.path.abspath(argv[2])
    if argv[1] == 'links':
        return check_links(src, pages(src, argv[3:]))
    build = os.path.abspath(argv[3])
    if argv[1] == 'self-test':
        return self_test(src, build)
    return run(src, build, pages(src, argv[4:]), keep=bool(os.environ.get('NK_DOCTEST_KEEP')))


if __name__ == '__main__':
    sys.exit(main(sys.argv))
