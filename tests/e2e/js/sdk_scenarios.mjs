// The unmodified `e2b` TypeScript SDK against a live AgentENV server.
//
// Configured only by the environment the SDK reads itself: E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY. Usage: `node sdk_scenarios.mjs <scenario>`.
// Prints one JSON line with what it observed and exits 0, or exits non-zero
// with the failure's message on stderr.

import assert from 'node:assert/strict'
import { Sandbox as CodeInterpreter } from '@e2b/code-interpreter'
import { CommandExitError, FileNotFoundError, NotFoundError, Sandbox, TimeoutError } from 'e2b'

const TAG = `js-${process.pid}-${Date.now()}`

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function waitUntil(predicate, timeoutMs, intervalMs = 100) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (await predicate()) return true
    await sleep(intervalMs)
  }
  return predicate()
}

async function expectReject(promise, ErrorClass) {
  try {
    await promise
  } catch (err) {
    assert.ok(err instanceof ErrorClass, `expected ${ErrorClass.name}, got ${err?.name}: ${err?.message}`)
    return err
  }
  assert.fail(`expected ${ErrorClass.name}, but the call succeeded`)
}

async function withSandbox(fn) {
  const sandbox = await Sandbox.create({ envs: { FROM_CREATE: 'yes' }, metadata: { sdk: 'js', tag: TAG } })
  try {
    return await fn(sandbox)
  } finally {
    await sandbox.kill().catch(() => {})
  }
}

async function commands(sbx) {
  const out = {}
  const result = await sbx.commands.run('echo hi; echo oops >&2')
  assert.deepEqual([result.stdout, result.stderr, result.exitCode], ['hi\n', 'oops\n', 0])
  out.basic = result

  const failed = await expectReject(sbx.commands.run('echo partial; exit 4'), CommandExitError)
  assert.equal(failed.exitCode, 4)
  assert.equal(failed.stdout, 'partial\n')
  out.exitError = { exitCode: failed.exitCode, stdout: failed.stdout }

  out.envs = (await sbx.commands.run('echo $FROM_CREATE $X', { envs: { X: '1' } })).stdout
  assert.equal(out.envs, 'yes 1\n')
  out.cwd = (await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout
  assert.equal(out.cwd, '/tmp\n')
  out.root = (await sbx.commands.run('whoami', { user: 'root' })).stdout
  assert.equal(out.root, 'root\n')
  out.defaultUser = (await sbx.commands.run('whoami')).stdout
  assert.equal(out.defaultUser, 'user\n')

  const big = await sbx.commands.run("head -c 1048576 /dev/zero | tr '\\0' a")
  assert.equal(big.stdout.length, 1048576)
  assert.ok(/^a+$/.test(big.stdout))
  out.bigLength = big.stdout.length

  const started = Date.now()
  const timedOut = await expectReject(sbx.commands.run('sleep 30', { timeoutMs: 2000 }), TimeoutError)
  out.timeout = { name: timedOut.name, seconds: (Date.now() - started) / 1000 }
  assert.ok(out.timeout.seconds < 20, `timeout took ${out.timeout.seconds}s`)

  const chunks = []
  const streamed = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.2; done', {
    onStdout: (data) => chunks.push(data),
  })
  assert.equal(chunks.join(''), '1\n2\n3\n')
  assert.equal(streamed.stdout, '1\n2\n3\n')
  out.chunks = chunks

  const errChunks = []
  await sbx.commands.run('echo e1 >&2; echo e2 >&2', { onStderr: (data) => errChunks.push(data) })
  assert.equal(errChunks.join(''), 'e1\ne2\n')
  out.stderrChunks = errChunks
  return out
}

async function background(sbx) {
  const out = {}
  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  const pids = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(pids.includes(sleeper.pid), `pid ${sleeper.pid} not in ${pids}`)
  out.listed = true
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  const killed = await expectReject(sleeper.wait(), CommandExitError)
  out.killedExitCode = killed.exitCode
  assert.equal(await sbx.commands.kill(999999), false)
  out.killMissing = false

  const reader = await sbx.commands.run('read line; echo got $line', { background: true, stdin: true })
  await sbx.commands.sendStdin(reader.pid, 'ping\n')
  out.stdin = (await reader.wait()).stdout
  assert.equal(out.stdin, 'got ping\n')

  const ticker = await sbx.commands.run('sleep 1; echo tick', { background: true })
  const again = await sbx.commands.connect(ticker.pid)
  out.connected = (await again.wait()).stdout
  assert.equal(out.connected, 'tick\n')
  await ticker.disconnect()

  const cat = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
  await cat.sendStdin('abc\n')
  await cat.closeStdin()
  out.closeStdin = (await cat.wait()).stdout
  assert.equal(out.closeStdin, 'abc\ndone\n')

  const looper = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await looper.kill(), true)
  await expectReject(looper.wait(), CommandExitError)
  const remaining = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(!remaining.includes(looper.pid), `${looper.pid} still listed`)
  out.handleKill = true

  await expectReject(sbx.commands.connect(999999), NotFoundError)
  await expectReject(sbx.commands.sendStdin(999999, 'x'), NotFoundError)
  out.missingPidErrors = true
  return out
}

async function pty(sbx) {
  const decoder = new TextDecoder()
  let output = ''
  const terminal = await sbx.pty.create({
    cols: 80,
    rows: 24,
    onData: (data) => {
      output += decoder.decode(data, { stream: true })
    },
  })
  await sbx.pty.resize(terminal.pid, { cols: 132, rows: 40 })
  await sbx.pty.sendInput(terminal.pid, new TextEncoder().encode('stty size; exit\n'))
  const result = await terminal.wait()
  assert.ok(output.includes('40 132'), `no "40 132" in PTY output ${JSON.stringify(output)}`)

  const idle = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sbx.pty.kill(idle.pid), true)
  await idle.wait().catch(() => {})
  return { exitCode: result.exitCode, sawNewSize: true, outputBytes: output.length, ptyKill: true }
}

async function files(sbx) {
  const out = {}
  const info = await sbx.files.write('notes/hello.txt', 'hello')
  assert.equal(info.path, '/home/user/notes/hello.txt')
  assert.equal(await sbx.files.read('notes/hello.txt'), 'hello')
  out.writePath = info.path

  const blob = new Uint8Array([0, 1, 255])
  await sbx.files.write('/tmp/blob.bin', blob.buffer)
  const bytes = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
  assert.deepEqual(Array.from(bytes), [0, 1, 255])
  out.bytes = Array.from(bytes)
  const asBlob = await sbx.files.read('/tmp/blob.bin', { format: 'blob' })
  assert.deepEqual(Array.from(new Uint8Array(await asBlob.arrayBuffer())), [0, 1, 255])
  const streamed = await sbx.files.read('notes/hello.txt', { format: 'stream' })
  assert.equal(await new Response(streamed).text(), 'hello')
  const upload = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode('from '))
      controller.enqueue(new TextEncoder().encode('a stream'))
      controller.close()
    },
  })
  await sbx.files.write('/tmp/streamed.txt', upload)
  assert.equal(await sbx.files.read('/tmp/streamed.txt'), 'from a stream')
  out.otherFormats = true

  const written = await sbx.files.writeFiles([
    { path: '/tmp/many/a.txt', data: 'a' },
    { path: '/tmp/many/b.txt', data: 'b' },
  ])
  assert.deepEqual(written.map((w) => w.path).sort(), ['/tmp/many/a.txt', '/tmp/many/b.txt'])
  out.listed = (await sbx.files.list('/tmp/many')).map((e) => e.name).sort()
  assert.deepEqual(out.listed, ['a.txt', 'b.txt'])

  assert.equal(await sbx.files.makeDir('/tmp/made/deep'), true)
  assert.equal(await sbx.files.makeDir('/tmp/made/deep'), false)
  assert.equal(await sbx.files.exists('/tmp/many/a.txt'), true)
  assert.equal(await sbx.files.exists('/tmp/nope'), false)
  const entry = await sbx.files.getInfo('/tmp/many/a.txt')
  assert.equal(entry.size, 1)
  assert.equal(entry.type, 'file')
  out.getInfo = { name: entry.name, size: entry.size, type: entry.type }
  const renamed = await sbx.files.rename('/tmp/many/a.txt', '/tmp/many/c.txt')
  assert.equal(renamed.path, '/tmp/many/c.txt')
  assert.equal(await sbx.files.exists('/tmp/many/c.txt'), true)
  await sbx.files.remove('/tmp/many')
  assert.equal(await sbx.files.exists('/tmp/many'), false)
  out.removed = true

  await sbx.files.makeDir('/tmp/watched')
  const names = new Set()
  const watcher = await sbx.files.watchDir('/tmp/watched', (event) => {
    names.add(event.name)
  })
  await sbx.files.write('/tmp/watched/new.txt', 'x')
  const seen = await waitUntil(() => names.has('new.txt'), 10000)
  await watcher.stop()
  assert.ok(seen, `no event for new.txt, saw ${[...names]}`)
  out.watched = [...names]

  await expectReject(sbx.files.read('/tmp/nope.txt'), FileNotFoundError)
  await expectReject(sbx.files.list('/tmp/nope'), NotFoundError)
  await expectReject(sbx.files.getInfo('/tmp/nope'), NotFoundError)
  await expectReject(sbx.files.watchDir('/tmp/nope', () => {}), NotFoundError)
  out.missingPathErrors = true
  return out
}

async function lifecycle(sbx) {
  const out = { sandboxId: sbx.sandboxId }
  const listed = await Sandbox.list({ query: { metadata: { tag: TAG }, state: ['running'] } }).nextItems()
  assert.deepEqual(
    listed.map((s) => s.sandboxId),
    [sbx.sandboxId],
  )
  out.listedRunning = listed.map((s) => ({ id: s.sandboxId, state: s.state, metadata: s.metadata }))

  const info = await sbx.getInfo()
  assert.deepEqual(info.metadata, { sdk: 'js', tag: TAG })
  assert.equal(info.state, 'running')
  out.info = { state: info.state, metadata: info.metadata, cpuCount: info.cpuCount, memoryMB: info.memoryMB }

  await sbx.setTimeout(120_000)
  const after = await sbx.getInfo()
  const remaining = (after.endAt.getTime() - Date.now()) / 1000
  assert.ok(remaining > 60 && remaining <= 130, `endAt ${after.endAt.toISOString()} is ${remaining}s away`)
  out.timeoutRemaining = Math.round(remaining)
  assert.equal(await sbx.isRunning(), true)
  const metrics = await sbx.getMetrics()
  assert.ok(Array.isArray(metrics))
  out.metricsSamples = metrics.length

  await sbx.commands.run('echo before > /tmp/state')
  assert.equal(await sbx.pause(), true)
  const paused = await Sandbox.list({ query: { metadata: { tag: TAG }, state: ['paused'] } }).nextItems()
  assert.deepEqual(
    paused.map((s) => [s.sandboxId, s.state]),
    [[sbx.sandboxId, 'paused']],
  )
  const both = await Sandbox.list({ query: { metadata: { tag: TAG }, state: ['running', 'paused'] } }).nextItems()
  assert.deepEqual(
    both.map((s) => s.sandboxId),
    [sbx.sandboxId],
  )
  out.listedPaused = paused.map((s) => s.state)

  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal(resumed.sandboxId, sbx.sandboxId)
  out.resumed = (await resumed.commands.run('echo resumed; cat /tmp/state')).stdout
  assert.equal(out.resumed, 'resumed\nbefore\n')
  assert.equal((await resumed.getInfo()).state, 'running')

  assert.equal(await resumed.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await expectReject(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
  assert.equal(await resumed.isRunning(), false)
  out.killed = true
  return out
}

// Every network setting of the SDK's, stored, shown (never the proxy's password) and
// replaced by an update; the addresses are documentation ones: no traffic is sent.
async function network() {
  const out = {}
  const rule = { transform: { headers: { 'X-Key': 'literal' } } }
  const sbx = await Sandbox.create({
    network: {
      allowOut: ['192.0.2.10', 'api.site.test'],
      denyOut: ['0.0.0.0/0'],
      rules: { 'API.site.test': [rule] },
      egressProxy: { address: '198.51.100.1:1080', username: 'u', password: 'p' },
      allowPublicTraffic: true,
      httpsPorts: [3000],
    },
  })
  try {
    out.created = (await sbx.getInfo()).network
    await sbx.updateNetwork({ allowOut: ['192.0.2.11'], denyOut: ['0.0.0.0/0'], rules: { '*.site.test': [rule] } })
    out.updated = (await sbx.getInfo()).network
  } finally {
    await sbx.kill()
  }
  return out
}

async function notFound() {
  const out = {}
  const missing = await expectReject(Sandbox.connect('inotasandbox00000000'), NotFoundError)
  out.connectError = missing.name
  out.killMissing = await Sandbox.kill('inotasandbox00000000')
  assert.equal(out.killMissing, false)
  const infoError = await expectReject(Sandbox.getInfo('inotasandbox00000000'), NotFoundError)
  out.getInfoError = infoError.name
  try {
    await Sandbox.create({ template: 'no-such-template' })
    assert.fail('creating from a missing template succeeded')
  } catch (err) {
    assert.ok(err instanceof Error && err.name !== 'AssertionError', String(err))
    out.badTemplateError = err.name
  }
  return out
}

async function codeInterpreter() {
  const out = {}
  const sbx = await CodeInterpreter.create({ metadata: { sdk: 'js', tag: TAG } })
  try {
    out.sum = (await sbx.runCode('1+1')).text
    const stdout = []
    const results = []
    await sbx.runCode('print("streamed")\nkept = 41\nkept + 1', {
      onStdout: (m) => stdout.push(m.line),
      onResult: (r) => results.push(r.text),
    })
    out.stdout = stdout.join('')
    out.results = results
    out.kept = (await sbx.runCode('kept')).text
    out.js = (await sbx.runCode('const a: number = 40; a + 2', { language: 'ts' })).text
    const context = await sbx.createCodeContext({ cwd: '/tmp' })
    out.cwd = (await sbx.runCode('import os; os.getcwd()', { context })).text
    out.error = (await sbx.runCode('1 / 0')).error?.name
  } finally {
    await sbx.kill().catch(() => {})
  }
  return out
}

const SCENARIOS = {
  commands: () => withSandbox(commands),
  background: () => withSandbox(background),
  pty: () => withSandbox(pty),
  files: () => withSandbox(files),
  lifecycle: () => withSandbox(lifecycle),
  not_found: notFound,
  codeInterpreter,
  network,
}

const name = process.argv[2]
if (!(name in SCENARIOS)) {
  console.error(`usage: node sdk_scenarios.mjs <${Object.keys(SCENARIOS).join('|')}>`)
  process.exit(2)
}
for (const variable of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[variable]) {
    console.error(`${variable} is not set`)
    process.exit(2)
  }
}

try {
  const results = await SCENARIOS[name]()
  console.log(JSON.stringify({ scenario: name, ok: true, results }))
  process.exit(0)
} catch (err) {
  console.error(`${name} failed: ${err?.name}: ${err?.message}`)
  if (err?.stack) console.error(err.stack)
  process.exit(1)
}
