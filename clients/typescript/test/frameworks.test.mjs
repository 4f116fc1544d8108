// The adapters under the real frameworks, with fake models (no network): a
// side-effecting tool runs at most once per tool call however often the
// framework runs it (a retried step, a replayed checkpoint), counted at a
// fake destination.

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createRequire } from 'node:module';
import { z } from 'zod';
import { generateText, stepCountIs, tool as aiTool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { Agent, Usage, run, setTracingDisabled, tool as agentsTool } from '@openai/agents';
import { tool as langchainTool } from '@langchain/core/tools';
import { AIMessage } from '@langchain/core/messages';
import { ToolNode } from '@langchain/langgraph/prebuilt';

const require = createRequire(import.meta.url);
const client = require('../dist/index.js');
const { addr, ids, Destination } = require('./helpers.js');

setTracingDisabled(true);

function setup(t) {
  const ledger = new client.Ledger(addr());
  t.after(() => ledger.close());
  return { ledger, dest: new Destination(), id: ids() };
}

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };

test('the Vercel AI SDK: generateText run twice with the same tool call', async (t) => {
  const { ledger, dest, id } = setup(t);
  const callId = id('call_1');
  const keys = [];
  const createTicket = client.guardAISDKTool(ledger, aiTool({
    description: 'Opens a ticket',
    inputSchema: z.object({ title: z.string() }),
    execute: async ({ title }, options, attempt) => {
      keys.push(attempt.idempotencyKey);
      assert.equal(options.toolCallId, callId);
      return { ...dest.apply(attempt.idempotencyKey).data, title };
    },
  }), { tool: 'tickets.create', permitId: 'approval-77' });
  const model = () => {
    let step = 0;
    return new MockLanguageModelV4({
      doGenerate: async () => {
        step += 1;
        if (step === 1) {
          return {
            content: [{ type: 'tool-call', toolCallId: callId, toolName: 'createTicket', input: JSON.stringify({ title: 'Printer on fire' }) }],
            finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage, warnings: [],
          };
        }
        return { content: [{ type: 'text', text: 'done' }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
      },
    });
  };
  const results = [];
  for (let i = 0; i < 2; i += 1) { // the agent's step run again, as after a crash before saving it
    const out = await generateText({ model: model(), tools: { createTicket }, prompt: 'open a ticket', stopWhen: stepCountIs(3) });
    results.push(out.steps[0].toolResults[0].output);
  }
  assert.deepEqual(results[0], { receipt: 'R-1', title: 'Printer on fire' });
  assert.deepEqual(results[1], results[0]);
  assert.deepEqual(keys, [callId]);
  assert.equal(dest.total(), 1);
});

test('the OpenAI Agents SDK: a run whose model calls the tool twice with one call id', async (t) => {
  const { ledger, dest, id } = setup(t);
  const callId = id('fc_1');
  const createTicket = agentsTool({
    name: 'create_ticket',
    description: 'Opens a ticket',
    parameters: z.object({ title: z.string() }),
    execute: client.guardAgentsExecute(ledger, async ({ title }, _context, _details, attempt) => ({
      ...dest.apply(attempt.idempotencyKey).data, title,
    }), { tool: 'tickets.create', runId: id('run') }),
  });
  const call = { type: 'function_call', callId, name: 'create_ticket', arguments: JSON.stringify({ title: 'x' }), status: 'completed' };
  const outputs = [[call], [call], [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'done' }] }]];
  const seen = [];
  const model = {
    async getResponse(request) {
      for (const item of Array.isArray(request.input) ? request.input : []) {
        if (item.type === 'function_call_result') seen.push(item.output);
      }
      return { usage: new Usage(), output: outputs.shift() };
    },
    // eslint-disable-next-line require-yield
    async* getStreamedResponse() { throw new Error('not streamed'); },
  };
  const agent = new Agent({ name: 'desk', instructions: 'open tickets', tools: [createTicket], model });
  const result = await run(agent, 'open a ticket');
  assert.equal(result.finalOutput, 'done');
  assert.equal(dest.total(), 1);
  assert.equal(seen.length >= 2, true);
});

test('LangGraph: a ToolNode step replayed after a checkpoint restore', async (t) => {
  const { ledger, dest, id } = setup(t);
  const callId = id('call_9');
  const createTicket = langchainTool(client.guardLangChainTool(ledger, async ({ title }, config, attempt) => {
    assert.equal(config.toolCall.id, callId);
    return `ticket ${dest.apply(attempt.idempotencyKey).resource_id}: ${title}`;
  }, { tool: 'tickets.create' }), { name: 'create_ticket', description: 'Opens a ticket', schema: z.object({ title: z.string() }) });
  const node = new ToolNode([createTicket]);
  const step = { messages: [new AIMessage({ content: '', tool_calls: [{ name: 'create_ticket', args: { title: 'x' }, id: callId, type: 'tool_call' }] })] };
  const first = await node.invoke(step);
  const again = await node.invoke(step);
  assert.equal(first.messages[0].content, 'ticket R-1: x');
  assert.equal(again.messages[0].content, first.messages[0].content);
  assert.equal(dest.total(), 1);
});
