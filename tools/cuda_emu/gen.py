# Rewrites kernel<<<cfg>>>(args); into ::emu::launch(threaded, [&] { kernel(args); }, cfg);
import re, sys
src = open(sys.argv[1]).read()
out = []
i = 0
while True:
    j = src.find('<<<', i)
    if j < 0:
        out.append(src[i:]); break
    # kernel name: identifier with optional template args right before <<<
    k = j
    while src[k-1] in ' \n': k -= 1
    name_end = k
    depth = 0
    while True:
        k -= 1
        c = src[k]
        if c == '>': depth += 1
        elif c == '<': depth -= 1
        elif depth == 0 and not (c.isalnum() or c == '_' or c == ':'):
            break
    name_start = k + 1
    name = src[name_start:name_end]
    e = src.find('>>>', j)
    cfg = src[j+3:e]
    assert src[e+3] == '(', src[e:e+10]
    p = e + 4; depth = 1
    while depth:
        if src[p] == '(': depth += 1
        elif src[p] == ')': depth -= 1
        p += 1
    args = src[e+4:p-1]
    threaded = 'true' if 'block_kernel' in name else 'false'
    out.append(src[i:name_start])
    out.append('::emu::launch(%s, [&] { %s(%s); }, %s)' % (threaded, name, args, cfg))
    i = p
open(sys.argv[2], 'w').write(''.join(out))
