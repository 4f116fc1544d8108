// Checks each value of the JSON array on stdin ({format, value}) as the
// official TypeScript client does (its AjvJsonSchemaValidator), and prints
// the verdicts as a JSON array of booleans. Run from a directory whose
// node_modules has @modelcontextprotocol/sdk.
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv';

let input = '';
for await (const chunk of process.stdin) input += chunk;
const validator = new AjvJsonSchemaValidator();
const verdicts = JSON.parse(input).map(({ format, value }) => validator.getValidator({ format })(value).valid);
console.log(JSON.stringify(verdicts));
