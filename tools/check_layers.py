#!/usr/bin/env python3
"""Checks that no room of stepgraph includes a room above it.

Folders are libraries and layers (README.md, Layout). A file belongs to the room of its
folder; a public header include/stepgraph/<room>/x.h belongs to <room>. Each room may
include itself and the rooms listed for it below, nothing else; the kernels also keep to
base's headers that need no Abseil, since nvcc compiles them. Prints every include that
breaks this, with file and line, and exits 1 if there is any.

  tools/check_layers.py [source root]
"""
import os
import re
import sys

# Room -> the rooms it may include (besides itself). Bottom to top.
ALLOWED = {
    'base': set(),
    'kernels': {'base'},
    'text': {'base'},
    'graph': {'base'},
    'dispatch': {'base', 'graph'},
    'dispatch/cuda': {'base', 'graph', 'dispatch', 'kernels'},
    'capture': {'base', 'graph', 'dispatch', 'dispatch/cuda'},
    'models': {'base', 'graph', 'text'},
    'runtime': {'base', 'graph', 'text', 'dispatch', 'dispatch/cuda', 'capture', 'models'},
    'c_api': {'base', 'graph', 'text', 'dispatch', 'dispatch/cuda', 'kernels', 'capture',
              'models', 'runtime'},
    'tools': {'base', 'graph', 'text', 'dispatch', 'capture', 'models', 'runtime'},
}
# The base headers a kernel may include: plain C++ that nvcc compiles for the device.
KERNEL_BASE_HEADERS = {'stepgraph/base/dtype.h', 'stepgraph/base/quant.h',
                       'stepgraph/base/error_flags.h', 'stepgraph/base/philox.h',
                       'stepgraph/base/half.h', 'stepgraph/base/penalty_params.h'}
SOURCE_EXTS = ('.cc', '.h', '.cu', '.cuh', '.inc')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def room_of_path(rel):
    """The room of a file (path relative to the root), or None outside the rooms."""
    if rel.startswith('include/stepgraph/'):
        rel = rel[len('include/stepgraph/'):]
    parts = rel.split('/')
    if len(parts) >= 3 and '/'.join(parts[:2]) in ALLOWED:
        return '/'.join(parts[:2])
    if len(parts) >= 2 and parts[0] in ALLOWED:
        return parts[0]
    return None


def room_of_include(target):
    if target.startswith('stepgraph/'):
        return room_of_path('include/' + target)
    return room_of_path(target)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    root = os.path.abspath(root)
    problems = []
    checked = 0
    for top in list(ALLOWED) + ['include/stepgraph']:
        if '/' in top and not top.startswith('include'):
            continue  # sub-rooms are walked with their parent
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXTS):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                room = room_of_path(rel)
                if room is None:
                    problems.append(f'{rel}: not in any room')
                    continue
                checked += 1
                with open(path, encoding='utf-8') as f:
                    for line_no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if room == 'kernels':
                            if target.startswith('absl/'):
                                problems.append(f'{rel}:{line_no}: kernels include no Abseil '
                                                f'({target})')
                                continue
                            if (target.startswith('stepgraph/base/') and
                                    target not in KERNEL_BASE_HEADERS):
                                problems.append(f'{rel}:{line_no}: kernels include only '
                                                f'{sorted(KERNEL_BASE_HEADERS)}, not {target}')
                                continue
                        to = room_of_include(target)
                        if to is None or to == room or to in ALLOWED[room]:
                            continue
                        problems.append(f'{rel}:{line_no}: {room} includes {target} '
                                        f'({to}), which is not below it')
    for p in problems:
        print(p)
    if problems:
        print(f'check_layers: {len(problems)} include(s) against the layers', file=sys.stderr)
        return 1
    print(f'check_layers: {checked} files, every include within its layers')
    return 0


if __name__ == '__main__':
    sys.exit(main())
