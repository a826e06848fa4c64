'use strict'
// The chat templates moved to lib/ (the JS API's ChatSession uses them too).
module.exports = require('../lib/chat-templates.js')
