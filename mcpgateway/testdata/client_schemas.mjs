// Compiles each schema of the JSON array on stdin ({schema, value}) as the
// official TypeScript client does (its AjvJsonSchemaValidator) and checks
// the value against it. Prints a JSON array of {compiles, valid}.
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';

let input = '';
for await (const chunk of process.stdin) input += chunk;
const validator = new AjvJsonSchemaValidator();
const verdicts = JSON.parse(input).map(({ schema, value }) => {
  let check;
  try { check = validator.getValidator(schema); } catch { return { compiles: false, valid: false }; }
  return { compiles: true, valid: check(value).valid };
});
console.log(JSON.stringify(verdicts));
